"""The backends' `GET /v1/models`, sans IO: the one parser for what the proxy learns there.

OpenAI's shape is `{"object": "list", "data": [{"id": NAME, ...}]}`. The backends add what the
proxy uses:

* llama.cpp: `data[].meta` with `n_vocab` (the vocabulary size, checked by the drift check)
  and `n_ctx` (the context the server was started with);
* vLLM (and SGLang): `data[].max_model_len` (the context length) and `root` (the model path);
* all three: `data[].owned_by`, which names the server (`proxy.core.backend.kind`).

Path B's `CodecRequest` names no model, so without `--model` the upstream's only model is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.core.backend.kind import BackendKind, entry_kind
from proxy.core.errors import UpstreamProtocolError, UpstreamUnavailable

MODELS_PATH: Final = "/v1/models"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model an upstream serves, with what it says about itself (None: not said)."""

    id: str
    vocab_size: int | None = None
    context_length: int | None = None
    # The server the entry names (`owned_by`, llama.cpp's `meta`), for `--backend auto`.
    backend: BackendKind | None = None


def parse_models(status: int, body: bytes) -> tuple[ModelEntry, ...]:
    """The models of a `/v1/models` answer; `UpstreamUnavailable` for a non-200 status,
    `UpstreamProtocolError` for a body that is not the OpenAI list."""
    if status != 200:
        raise UpstreamUnavailable(f"GET {MODELS_PATH} answered {status}", code="model_list_failed")
    try:
        document: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(
            f"GET {MODELS_PATH} is not JSON: {exc}", code="bad_model_list"
        ) from exc
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise UpstreamProtocolError(f"GET {MODELS_PATH} has no `data` list", code="bad_model_list")
    return tuple(
        _entry(item) for item in data if isinstance(item, dict) and _is_str(item.get("id"))
    )


def only_model(models: tuple[ModelEntry, ...]) -> str:
    """The one model listed; `UpstreamProtocolError` when there are none or several."""
    if len(models) != 1:
        names = ", ".join(m.id for m in models[:5]) or "none"
        raise UpstreamProtocolError(
            f"the upstream serves {len(models)} models ({names}): "
            "set --model to say which one Codec requests without a model use",
            code="model_unknown",
            public=True,  # the names are what the upstream's /v1/models tells any client
        )
    return models[0].id


def find_model(models: tuple[ModelEntry, ...], name: str | None) -> ModelEntry | None:
    """`name`'s entry, else the only model listed; None when that is not one entry.

    A server that lists one model answers for it under any name (llama.cpp lists its GGUF's
    path, whatever the proxy calls the model), so its one entry speaks for the name.
    """
    matching = [m for m in models if m.id == name]
    if len(matching) == 1:
        return matching[0]
    return models[0] if len(models) == 1 else None


def models_document(names: Sequence[str], *, created: int, owned_by: str) -> bytes:
    """`GET /v1/models` in OpenAI's list shape: one entry per name a client may use."""
    data = [{"id": n, "object": "model", "created": created, "owned_by": owned_by} for n in names]
    return orjson.dumps({"object": "list", "data": data})


def model_document(name: str, *, created: int, owned_by: str) -> bytes:
    """`GET /v1/models/{name}`: the one entry."""
    return orjson.dumps({"id": name, "object": "model", "created": created, "owned_by": owned_by})


def _entry(item: dict[str, Any]) -> ModelEntry:
    meta = item.get("meta")
    meta = meta if isinstance(meta, dict) else {}
    context = _count(item.get("max_model_len")) or _count(meta.get("n_ctx"))
    backend = entry_kind(item.get("owned_by"), item.get("meta"))
    return ModelEntry(item["id"], _count(meta.get("n_vocab")), context, backend)


def _is_str(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
