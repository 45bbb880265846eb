"""The JSON body a Codec request becomes upstream, and the fields the proxy adds to it.

The client's fields go up as they came (minus `stream_format`), with `stream: true` (binary
implies streaming, codec-spec.md §2). Two things are decided at the last moment, in
proxy/server/codec.py: the model name (when the request has none) and whether to ask the
backend for the IDs it sampled (`--token-ids`; environment.md "Ground-truth IDs"):

* `return_token_ids: true`: vLLM then reports `token_ids` per chunk; other servers ignore it.
* `logprobs`: llama.cpp then reports each sampled token's `id` (`logprobs.content[].id`).
  Completions take a count (1); chat takes `true`, and `top_logprobs` is dropped because
  llama.cpp reports no content at `top_logprobs: 0`. Not for chat requests with `tools`:
  llama.cpp refuses `logprobs` with tools in a stream ("logprobs is not supported with
  tools + stream"), so such requests get only `return_token_ids`.

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

from proxy.core.errors import BadRequest

Endpoint = Literal["completions", "chat"]

# orjson serializes at most this many levels of nesting (it parses up to 1024).
MAX_DEPTH: Final = 254


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    endpoint: Endpoint
    fields: Mapping[str, Any]

    @property
    def has_model(self) -> bool:
        return isinstance(self.fields.get("model"), str)

    def body(self, *, model: str | None, ask_for_ids: bool) -> bytes:
        body = dict(self.fields)
        body["stream"] = True
        if model is not None and not self.has_model:
            body["model"] = model
        if ask_for_ids:
            body["return_token_ids"] = True
            if self.endpoint == "completions":
                body["logprobs"] = 1
            elif not body.get("tools"):
                body["logprobs"] = True
                body.pop("top_logprobs", None)
        try:
            return orjson.dumps(body)
        except orjson.JSONEncodeError as exc:
            # The fields came from a parsed request, so only their depth can fail here: a
            # client error, found before the upstream is contacted.
            raise BadRequest(
                f"request fields nest deeper than {MAX_DEPTH} levels: {exc}", code="invalid_json"
            ) from exc
