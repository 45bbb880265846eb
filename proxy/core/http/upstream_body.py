"""The JSON body a Codec request becomes upstream, and the fields the proxy adds to it.

The client's fields go up as they came (minus `stream_format`), with `stream: true` (binary
implies streaming, codec-spec.md §2). Two things are decided at the last moment, in
proxy/server/control/codec.py: the model name (when the request has none) and whether to ask the
backend for the IDs it sampled (`--token-ids`), and in which field: the one the backend behind
the upstream reports them in (`--backend`, proxy/core/backend/kind.py; environment.md
"Ground-truth IDs"), each in the smallest form that still carries them:

* vLLM, SGLang: `return_token_ids: true`, then `token_ids` per chunk. Their logprobs entries
  carry no IDs, so `logprobs` would only be work for the backend.
* llama.cpp: `logprobs`, then each sampled token's `id` (`logprobs.content[].id`); it ignores
  `return_token_ids`. Completions take a count, 1 (at 0 llama.cpp reports no content). Chat
  takes `true` with `top_logprobs: 1`: without it llama.cpp lists 20 alternatives per token
  (measured: 2,124 upstream bytes per token, against 526 at 1 and 324 with no logprobs;
  docs/BENCHMARKS.md section 6), and at 0 no content. Not for chat requests with `tools`:
  llama.cpp refuses `logprobs` with tools in a stream ("logprobs is not supported with
  tools + stream"), so such requests ask llama.cpp for nothing.
* not known: both, as above.

When the proxy asks for IDs, the probability fields are its own: a Codec stream carries no
probabilities, so the client's `logprobs`, `top_logprobs` and `n_probs` (llama.cpp's count,
which overrides `logprobs` on completions) are dropped rather than computed for nothing.

These fields only ever go on Codec requests: a JSON client's request is relayed byte for byte
and its response is the backend's, so it never sees them.

Serialized with orjson: a token-ID prompt of a million IDs takes it a few tens of milliseconds
where `json.dumps` takes ten times that, all of it holding the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from proxy.core.backend.kind import BackendKind
from proxy.core.errors import BadRequest

Endpoint = Literal["completions", "chat"]

# orjson serializes at most this many levels of nesting (it parses up to 1024).
MAX_DEPTH: Final = 254
# The client's requests for probabilities, which a Codec stream never carries.
PROBABILITY_FIELDS: Final = ("logprobs", "top_logprobs", "n_probs")


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    endpoint: Endpoint
    fields: Mapping[str, Any]

    @property
    def has_model(self) -> bool:
        return isinstance(self.fields.get("model"), str)

    def id_fields(self, backend: BackendKind | None) -> dict[str, Any]:
        """The fields that ask `backend` (None: not known) for the IDs it samples; empty when
        it has no way to report them for this request."""
        fields: dict[str, Any] = {}
        if backend != "llamacpp":
            fields["return_token_ids"] = True
        if backend in (None, "llamacpp"):
            if self.endpoint == "completions":
                fields["logprobs"] = 1
            elif not self.fields.get("tools"):
                fields["logprobs"] = True
                fields["top_logprobs"] = 1
        return fields

    def body(
        self,
        *,
        model: str | None,
        ask_for_ids: bool,
        backend: BackendKind | None = None,
        rename: bool = False,
    ) -> bytes:
        """The upstream body: `model` when the request names none, or always with `rename`
        (the upstream knows the model by another name than the client uses)."""
        body = dict(self.fields)
        body["stream"] = True
        if model is not None and (rename or not self.has_model):
            body["model"] = model
        if ask_for_ids:
            for name in PROBABILITY_FIELDS:
                body.pop(name, None)
            body.update(self.id_fields(backend))
        try:
            return orjson.dumps(body)
        except orjson.JSONEncodeError as exc:
            # The fields came from a parsed request, so only their depth can fail here: a
            # client error, found before the upstream is contacted.
            raise BadRequest(
                f"request fields nest deeper than {MAX_DEPTH} levels: {exc}", code="invalid_json"
            ) from exc
