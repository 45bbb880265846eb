"""What a client may learn of this server before its first request: `GET /codec/version`.

The Codec I-D (draft-dunn-codec-00, § Capability advertisement) adds to v0.5 a document,
`{"version", "stream_formats", "delta_varint"}`, and a `Codec-Server-Version` header
(codec-spec.md §3.6, §4; interop.md §1.11). Both say what the proxy really does: the formats
come from the registry requests are negotiated with (core/wire/formats.py), and a model the
rollout switches refuse to everyone lists none. A format a request gets as another one
(`protobuf-delta`, answered as `protobuf`) is not listed, so a client that asks only for what
is listed gets what it asked for.

Per model: the top level answers for a request that names no model (the default model); with
several models, `models` holds each name (aliases too) whose answer differs from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from proxy.core.http.versioning import SERVER_VERSION
from proxy.core.wire.formats import DELTA_FORMATS, SERVED_AS_ASKED


@dataclass(frozen=True)
class Capabilities:
    """What one model serves as Codec."""

    stream_formats: tuple[str, ...]

    @property
    def delta_varint(self) -> bool:
        return any(f in DELTA_FORMATS for f in self.stream_formats)

    def fields(self) -> dict[str, object]:
        return {"stream_formats": list(self.stream_formats), "delta_varint": self.delta_varint}


def capabilities(*, codec_served: bool) -> Capabilities:
    """A model's: every format served as asked, or none when Codec is refused to everyone."""
    return Capabilities(SERVED_AS_ASKED if codec_served else ())


def version_document(default: Capabilities, by_name: Mapping[str, Capabilities]) -> bytes:
    """The `/codec/version` body: `default` at the top level, and under `models` each name of
    `by_name` whose capabilities differ from it (no `models` when none does)."""
    document: dict[str, object] = {"version": str(SERVER_VERSION), **default.fields()}
    differing = {name: c.fields() for name, c in by_name.items() if c != default}
    if differing:
        document["models"] = differing
    return orjson.dumps(document)
