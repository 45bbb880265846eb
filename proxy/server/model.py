"""The model name for Codec requests that cannot name one.

Path B's `CodecRequest` has no `model` field (codec-spec.md §3.3, §11 item 25): the proxy sends
`--model`, or else the upstream's only model from `GET /v1/models`, looked up on first use
(after any check that refuses the request, so it is the request's first upstream contact) and
remembered. An upstream with several models and no `--model` is a configuration error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.core.errors import UpstreamProtocolError, UpstreamUnavailable

MODELS_PATH = "/v1/models"


class ModelResolver:
    """One per app: the configured model, or the upstream's only one once looked up."""

    def __init__(self, configured: str | None) -> None:
        self._name = configured
        self._lock = asyncio.Lock()

    async def name(self, list_models: Callable[[], Awaitable[tuple[int, bytes]]]) -> str:
        """The name; `list_models` does the `GET /v1/models` (status, body) when needed."""
        if self._name is None:
            async with self._lock:  # one lookup, however many requests are waiting for it
                if self._name is None:
                    self._name = only_model(*await list_models())
        return self._name


def only_model(status: int, raw: bytes) -> str:
    """The one model id in an OpenAI `/v1/models` answer."""
    if status != 200:
        raise UpstreamUnavailable(
            f"GET {MODELS_PATH} answered {status}: cannot name the model; set --model"
        )
    try:
        listing: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UpstreamProtocolError(
            f"GET {MODELS_PATH} is not JSON: {exc}", code="bad_model_list"
        ) from exc
    data = listing.get("data") if isinstance(listing, dict) else None
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    names = [name for name in ids if isinstance(name, str)]
    if len(names) != 1:
        raise UpstreamProtocolError(
            f"the upstream serves {len(names)} models ({', '.join(names[:5]) or 'none'}): "
            "set --model to say which one Codec requests without a model use",
            code="model_unknown",
        )
    return names[0]
