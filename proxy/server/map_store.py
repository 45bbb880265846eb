"""The maps this proxy publishes, by id and by digest, with their compressed bodies cached."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable, Sequence

import brotli

from proxy.core.discovery import Coding
from proxy.core.tokenizer_map import PublishedMap

# Compressed once per map and coding, on first request, in a worker thread: a Llama-3 map is
# 6 MB, and these levels take well under a second for it where the maximum levels take many.
GZIP_LEVEL = 6
BROTLI_QUALITY = 5
COMPRESSORS: dict[Coding, Callable[[bytes], bytes]] = {
    # mtime=0: the same map compresses to the same bytes on every run.
    "gzip": lambda body: gzip.compress(body, GZIP_LEVEL, mtime=0),
    "br": lambda body: brotli.compress(body, quality=BROTLI_QUALITY),
}


class MapStore:
    def __init__(self, maps: Sequence[PublishedMap]) -> None:
        self.maps = tuple(maps)
        self._by_id = {published.id: published for published in self.maps}
        self._by_digest = {published.digest: published for published in self.maps}
        self._encoded: dict[tuple[str, Coding], asyncio.Task[bytes]] = {}

    def by_id(self, map_id: str) -> PublishedMap | None:
        return self._by_id.get(map_id)

    def by_digest(self, digest: str) -> PublishedMap | None:
        return self._by_digest.get(digest)

    async def encoded(self, published: PublishedMap, coding: Coding) -> bytes:
        """`published.body` in `coding`; concurrent first requests share one compression."""
        key = (published.digest, coding)
        task = self._encoded.get(key)
        if task is None:
            task = asyncio.create_task(asyncio.to_thread(COMPRESSORS[coding], published.body))
            self._encoded[key] = task
        return await asyncio.shield(task)
