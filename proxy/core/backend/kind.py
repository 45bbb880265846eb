"""Which server is behind the upstream URLs, sans IO: vLLM, llama.cpp or SGLang.

It decides which field asks the backend for the IDs it sampled (proxy/core/http/upstream_body.py,
docs/ENDPOINTS.md "Token IDs"): each backend reports them in its own field, and asking one for
another's field is work, and upstream bytes, for nothing.

`--backend auto` (the default) reads the kind from the `GET /v1/models` answer the proxy already
takes (the drift check at start and then periodically, Path B's model lookup):

* what its entries say of their owner, `owned_by`: `"vllm"`, `"llamacpp"` and `"sglang"` are what
  those servers write (vLLM's and SGLang's `ModelCard` defaults; tests/fixtures/upstream/
  llamacpp-models.txt);
* failing that, llama.cpp's own `meta` object (`n_vocab`, `n_ctx`);
* failing that, the answer's `Server` header: llama.cpp sends `Server: llama.cpp`. vLLM and
  SGLang both send `server: uvicorn`, as do other FastAPI servers (llama-cpp-python's among them,
  whose logprobs carry no IDs), so that header names no kind.

Entries that name different kinds, or none, leave the kind unknown: every backend's field is then
asked for, as a proxy that knew nothing would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

BackendKind = Literal["vllm", "llamacpp", "sglang"]
BackendSetting = Literal["auto", "vllm", "llamacpp", "sglang"]
BACKEND_KINDS: Final[tuple[BackendKind, ...]] = ("vllm", "llamacpp", "sglang")

_LLAMACPP_SERVER: Final = "llama.cpp"


def entry_kind(owned_by: object, meta: object) -> BackendKind | None:
    """The kind one `/v1/models` entry names: by its `owned_by`, else by llama.cpp's `meta`."""
    for kind in BACKEND_KINDS:
        if owned_by == kind:
            return kind
    if isinstance(meta, dict) and "n_vocab" in meta:
        return "llamacpp"
    return None


def detect_kind(entries: Iterable[BackendKind | None], server: str | None) -> BackendKind | None:
    """The kind a `/v1/models` answer shows: the one its entries name, else its `Server` header's;
    None when the entries name several kinds or nothing says."""
    named = {kind for kind in entries if kind is not None}
    if len(named) == 1:
        return named.pop()
    if named:
        return None
    if server is not None and server.strip().lower().startswith(_LLAMACPP_SERVER):
        return "llamacpp"
    return None


def backend_kind(setting: BackendSetting, detected: BackendKind | None) -> BackendKind | None:
    """The kind requests are built for: the configured one, else (`auto`) the detected one."""
    return detected if setting == "auto" else setting
