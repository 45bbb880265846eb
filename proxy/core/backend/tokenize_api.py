"""The backends' `/tokenize`, sans IO: request bodies in, token ids out.

Recorded shapes (tests/fixtures/upstream/, README there):

* llama.cpp: POST `{"content": TEXT, "add_special": false, "parse_special": false}` ->
  `{"tokens": [ids]}`. Without `content` it answers 200 `{"tokens": []}`, so a vLLM-shaped
  body cannot tell it apart from an empty text.
* vLLM: POST `{"prompt": TEXT, "add_special_tokens": false[, "model": NAME]}` ->
  `{"count", "max_model_len", "tokens": [ids], "token_strs"}`; a body without `prompt` is a 4xx
  validation error.

Hence the detection order: llama.cpp's shape first (vLLM refuses it), then vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.errors import UpstreamProtocolError

TOKENIZE_PATH = "/tokenize"


@dataclass(frozen=True)
class TokenizeDialect:
    """How one backend's `/tokenize` wants plain text tokenized: no BOS, no special parsing."""

    name: str
    text_field: str
    fixed: tuple[tuple[str, Any], ...]
    sends_model: bool

    def request_body(self, text: str, model: str | None) -> bytes:
        body: dict[str, Any] = {self.text_field: text, **dict(self.fixed)}
        if self.sends_model and model is not None:
            body["model"] = model
        return orjson.dumps(body)


LLAMACPP = TokenizeDialect(
    "llama.cpp", "content", (("add_special", False), ("parse_special", False)), False
)
VLLM = TokenizeDialect("vLLM", "prompt", (("add_special_tokens", False),), True)
DIALECTS = (LLAMACPP, VLLM)


def parse_tokens(body: bytes) -> list[int]:
    """The ids of a `/tokenize` answer, the same field in both dialects."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(f"/tokenize answered with invalid JSON: {exc}") from exc
    tokens = document.get("tokens") if isinstance(document, dict) else None
    if not isinstance(tokens, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in tokens
    ):
        raise UpstreamProtocolError("/tokenize answer has no 'tokens' list of ids")
    return tokens
