"""Runtime settings: one frozen value, built by the CLI and handed to the app factory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MiB = 1 << 20


@dataclass(frozen=True)
class Settings:
    upstream: str
    tokenizer: Path
    host: str = "127.0.0.1"
    port: int = 8080
    # The model name sent upstream when a Codec request does not name one.
    model: str | None = None
    # Request bodies are capped (decompressed size) before anything is parsed.
    max_body_bytes: int = 32 * MiB
    # One SSE event from the upstream may not exceed this (a bounded parser, peers.md A3).
    max_event_bytes: int = 1 * MiB
    connect_timeout: float = 10.0
    # Explicit pool limits: aiohttp's silent default of 100 queues request 101 (peers.md A1).
    pool_limit: int = 1024
    pool_limit_per_host: int = 0
    # Shorter than uvicorn's 5 s idle close, so we never reuse a connection it is closing (A8).
    keepalive_timeout: float = 4.0
    # Version negotiation and the safety policy (codec-spec.md §6, §8). Both capabilities are
    # off by default: nothing is enforced, no 426 is ever sent, JSON passes through untouched.
    # A policy file enables the safety policy (enforced on every stream; its headers go to
    # clients at 0.4+); `enforce_safety_policy` also answers clients below 0.4 with 426.
    safety_policy: Path | None = None
    enforce_safety_policy: bool = False
    # off | advisory (log clients below 0.4, serve them) | strict (426 below 0.4).
    version_policy: Literal["off", "advisory", "strict"] = "off"
    # Echoed in the 426 body and /.well-known/codec/version-policy.json when set.
    deployment_id: str | None = None
    docs_url: str | None = None
    # The id clients discover the tokenizer map by (`/.well-known/codec/maps/<id>.json`) and
    # that `Codec-Tokenizer-Map` names; default: a Codec map's own id, else the file's name.
    map_id: str | None = None
    # Compare our tokenizer with the backend's /tokenize at start and then this often: Codec
    # IDs from a tokenizer the backend does not use would be silently wrong (issue 4).
    drift_check: bool = True
    drift_check_interval: float = 300.0
