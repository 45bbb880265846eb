"""Runtime settings: one frozen value, built by the CLI and handed to the app factory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MiB = 1 << 20
# The trained dictionaries shipped with the proxy (dictionaries/manifest.json).
DEFAULT_DICTIONARIES_MANIFEST = (
    Path(__file__).resolve().parent.parent / "dictionaries" / "manifest.json"
)


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
    # Compressed Codec streams flush when the oldest unflushed frame has waited this long, or
    # when `flush_frames` frames are pending; 0 flushes every frame. The first frame is always
    # flushed at once. Defaults measured in docs/COMPRESSION.md.
    flush_interval_ms: float = 50.0
    flush_frames: int = 32
    # Frames of one flush window leave as one frame: fewer bytes, same latency.
    merge_frames: bool = True
    # zstd dictionaries (codec-spec.md §5: zstd only with one). The manifest's are loaded at
    # start and their sha256 verified (None: no manifest); `zstd_dicts` entries
    # ("msgpack=PATH", "protobuf=PATH") replace the manifest's for their format.
    dictionaries_manifest: Path | None = DEFAULT_DICTIONARIES_MANIFEST
    zstd_dicts: tuple[str, ...] = ()
