"""Which Codec version a client speaks, and what it may therefore receive (codec-spec.md §4, §6).

Graceful downgrade is normative (v0.4/v0.5 § Graceful downgrade): a client that declared
`Codec-Client-Version: 0.X` MUST NOT receive a `Codec-*` header or an in-band signal introduced
after 0.X; "a v0.4 server talking to a v0.3 client must look exactly like a v0.3 server". The
floors below are that rule as data: one table for headers, one for finish reasons, each applied
in exactly one place at the edge (the response-prepare hook and the stream guard).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from proxy.core.wire import finish

CLIENT_VERSION_HEADER = "Codec-Client-Version"


@dataclass(frozen=True, slots=True, order=True)
class ClientVersion:
    """A Codec `major.minor`; patch parts carry no wire meaning (only the minor matters)."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


V0_0 = ClientVersion(0, 0)
V0_2 = ClientVersion(0, 2)
V0_3 = ClientVersion(0, 3)
V0_4 = ClientVersion(0, 4)
V0_5 = ClientVersion(0, 5)

# The Codec version this proxy speaks: v0.5, the latest (codec-spec.md §0), which the I-D
# (draft-dunn-codec-00) also describes. Sent as `Codec-Server-Version` and in `/codec/version`
# (core/http/server_version.py).
SERVER_VERSION = V0_5
SERVER_VERSION_HEADER = "Codec-Server-Version"

# An absent header means 0.2 for the floors: the spec says both "0.0" and "0.2" (codec-spec.md
# §11 item 3), every engine uses 0.2, and it keeps the 0.2 headers for header-less clients. It
# declares nothing, though (`ParsedClientVersion.declared`): dictionary zstd needs a stated
# version (content_coding.may_send_zstd), since a generic HTTP client sends none.
ABSENT_CLIENT_VERSION = V0_2
# An unparsable header means 0.0: nothing newer than the baseline is sent (codec-spec.md §4).
UNPARSABLE_CLIENT_VERSION = V0_0

# "0.4", "v0.4", "0.4.1", " V0.4 " -> (0, 4). A dotted pair is required; "1" alone is not a
# version we can place.
_VERSION = re.compile(r"[vV]?(\d{1,6})\.(\d{1,6})(?:\.\d{1,6})?")


@dataclass(frozen=True, slots=True)
class ParsedClientVersion:
    """The version a request is treated as, and whether its header could be read."""

    version: ClientVersion
    # The edge logs unparsable ones (once per client address).
    source: Literal["absent", "valid", "unparsable"]

    @property
    def unparsable(self) -> bool:
        return self.source == "unparsable"

    @property
    def declared(self) -> ClientVersion | None:
        """The version the client stated; None when it sent no header (an unparsable one is
        stated, as 0.0). Only a stated version says the client is a Codec client at all."""
        return None if self.source == "absent" else self.version


def parse_client_version(header: str | None) -> ParsedClientVersion:
    """`Codec-Client-Version` as the comparison value (codec-spec.md §12 item 25)."""
    if header is None or not header.strip():
        return ParsedClientVersion(ABSENT_CLIENT_VERSION, "absent")
    match = _VERSION.fullmatch(header.strip())
    if match is None:
        return ParsedClientVersion(UNPARSABLE_CLIENT_VERSION, "unparsable")
    return ParsedClientVersion(ClientVersion(int(match[1]), int(match[2])), "valid")


# The floor table (v0.4/v0.5 § Graceful downgrade, reference floor table; interop.md §2.4).
# Keys are lowercase header names. A `Codec-*` header that is not listed is withheld from every
# client: a header whose introduction version nobody wrote down cannot be proved safe to send,
# so adding one means adding its row here.
HEADER_FLOORS: Mapping[str, ClientVersion] = {
    # The 426 handshake itself: the one exception to graceful downgrade, since it exists to
    # tell an old client what to upgrade to (v0.4 § Version Compatibility Signaling).
    "codec-min-version": V0_0,
    "codec-required-features": V0_0,
    "codec-tokenizer-map": V0_2,
    "codec-zstd-dict": V0_2,
    "codec-latent-map": V0_3,
    "codec-map": V0_3,
    # `Codec-Safety-Policy` is the spec's name, `-Id` the Codec website's (codec-spec.md §11
    # item 6); we send both, so both have the same floor.
    "codec-safety-policy": V0_4,
    "codec-safety-policy-id": V0_4,
    "codec-safety-policy-hash": V0_4,
    # The proxy's own headers (docs/ENDPOINTS.md): no spec version introduced them, so they
    # get the baseline every engine assumes, like `Codec-Tokenizer-Map`.
    "codec-token-source": V0_2,
    "codec-stream-format": V0_2,
    # Only the I-D defines it, and the I-D describes version 0.5: introduced after 0.4 for the
    # rule above, so a 0.4 client keeps seeing a 0.4 server (docs/VERSIONING_AND_SAFETY.md).
    "codec-server-version": V0_5,
}

# In-band signals have floors too: `policy_violation` is a v0.4 finish reason; older clients
# get `error`, the value they treat unknown reasons as anyway (v0.4 § How v0.4 satisfies the
# rule).
FINISH_REASON_FLOORS: Mapping[str, tuple[ClientVersion, str]] = {
    finish.POLICY_VIOLATION: (V0_4, finish.ERROR),
}

_CODEC_PREFIX = "codec-"


def allows_header(client: ClientVersion, name: str) -> bool:
    """Whether a response header may go to a client of this version.

    Non-Codec headers always may. Below 0.2 no `Codec-*` header is sent at all (except the 426
    handshake), and therefore no zstd, whose responses require `Codec-Zstd-Dict`.
    """
    lowered = name.lower()
    if not lowered.startswith(_CODEC_PREFIX):
        return True
    floor = HEADER_FLOORS.get(lowered)
    return floor is not None and client >= floor


def withheld_headers(client: ClientVersion, names: Iterable[str]) -> list[str]:
    """The header names (as given) that this client must not receive."""
    return [name for name in names if not allows_header(client, name)]


def finish_reason_for(client: ClientVersion, reason: str) -> str:
    """The finish reason as this client may receive it."""
    floor = FINISH_REASON_FLOORS.get(reason)
    if floor is None or client >= floor[0]:
        return reason
    return floor[1]


# The published Codec versions (codec-spec.md §0): metric labels take only these, `absent` and
# `other`, so a client sending `Codec-Client-Version: 9.99` cannot add a series.
KNOWN_VERSIONS = frozenset(ClientVersion(0, minor) for minor in range(1, 6))


def version_label(parsed: ParsedClientVersion) -> str:
    """The bounded metric value for a request's `Codec-Client-Version`."""
    if parsed.source == "absent":
        return "absent"
    return str(parsed.version) if parsed.version in KNOWN_VERSIONS else "other"
