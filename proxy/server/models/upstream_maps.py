"""A Codec upstream's tokenizer maps and zstd dictionaries: fetched, verified and pinned.

A model whose upstream speaks Codec (`upstream_protocol = "codec"`) renders the upstream's
frames with the map the upstream publishes; it has no tokenizer of its own. The map is found
two ways, and trusted one way only, by its sha256:

* at start, from the upstream's `/.well-known/codec/index.json` (the entry that lists the
  model's name upstream, or the only one), so that `/readyz` can say the map is pinned before
  the first request;
* on every Codec answer, from `Codec-Tokenizer-Map`: the map the answer's IDs follow.

Either way the bytes come from the upstream's content-addressed path
(`/.well-known/codec/maps/sha256/<hex>.json`), are read within a bound and hashed as they come
(proxy/core/client/reading.py), checked against the digest (proxy/core/client/assets.py), and
the decoder is built once per map, off the event loop.
Dictionaries likewise, from `/.well-known/codec/dicts/<hex>.zstd`: those the pinned map lists
are fetched ahead, since a client can only ask for zstd once it holds the dictionary.

What can go wrong, and what becomes of it (each counted in `codec_proxy_upstream_maps_total`
and shown by the `upstream_map` readiness check):

* A map fetched and verified (`pinned`): ready, `upstream_map_pinned`; rendered.
* An answer names another map than the pinned one (`drift`: a new model upstream, a fleet
  mid-rollout): that map is fetched and verified before the answer is rendered with it, and
  the pin moves to it; readiness stays as it was.
* An answer's IDs go past its map's vocabulary (`drift` too: its IDs follow another map than
  the one it names): that answer ends as an error (proxy/core/render/turn.py), and the map is
  fetched and verified again before another answer is rendered with it.
* The map cannot be fetched (`unavailable`): the request is asked again as JSON; readiness is
  unchanged (not ready while nothing was ever pinned).
* Bytes that do not hash to the digest, or are no map (`hash_mismatch`, `not_a_map`): not
  ready, `upstream_map_mismatch`, until a map verifies; the request is asked again as JSON, and
  for `BAD_SECONDS` no Codec is asked of the upstream (each such answer costs two generations)
  nor the digest fetched again.
* The index lists no map for the model (an engine that publishes none): ready,
  `upstream_map_on_first_answer`; the first answer's map is pinned.

Never rendered: IDs with a map whose bytes were not verified. A mismatch makes the model not
ready, as the tokenizer drift check does: nothing a client sends can cause it, while the
upstream (or something between) serves other bytes than it names.

Verified maps and dictionaries are also what this proxy's own discovery paths serve by digest
(proxy/server/control/well_known.py), so a Codec client of this proxy, whose requests are
relayed to the upstream, finds the map its answers name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import aiohttp

from proxy.core.backend.readiness import Check, Readiness
from proxy.core.client.ask import RefusalMemory
from proxy.core.client.assets import CodecAssets, CodecIntegrityError
from proxy.core.client.reading import (
    MAX_DICTIONARY_BYTES,
    MAX_INDEX_BYTES,
    MAX_MAP_BYTES,
    BodyReader,
    ReadBody,
)
from proxy.core.compression.dictionaries import dictionary_url
from proxy.core.errors import ProxyError
from proxy.core.maps.discovery import WELL_KNOWN_PREFIX, map_path_by_digest, pointer_for, read_index
from proxy.core.maps.tokenizer_map import PublishedMap
from proxy.core.verify.map_decoder import MapDecoder
from proxy.server.data.upstreams import UpstreamPool
from proxy.server.telemetry.metrics import Metrics

log = logging.getLogger("codec_proxy")

UPSTREAM_MAP_CHECK: Final = "upstream_map"
INDEX_PATH: Final = WELL_KNOWN_PREFIX + "index.json"
# codecai's `load_map` allows a fetch 30 s; a map crosses the long hop once.
FETCH_SECONDS: Final = 30.0
# While nothing is pinned and the index could not be read: look again this often.
RETRY_SECONDS: Final = 10.0
# A digest whose bytes did not verify is not fetched again before this: every answer naming
# it would otherwise fetch megabytes again.
BAD_SECONDS: Final = 60.0
# The discovery documents are compressed by codec-proxy when asked (docs/TOKENIZER_MAPS.md);
# the proxy's session does not decode them, the capped decompressors do.
_FETCH_HEADERS: Final = (("Accept-Encoding", "br, gzip"), ("User-Agent", "codec-proxy-maps"))


class MapUnavailable(ProxyError):
    """A map or dictionary the upstream names could not be had (its fetch failed)."""

    status_hint = 502


class UpstreamMaps:
    """One Codec upstream's maps and dictionaries, by digest. `assets` may be shared by several
    models (content-addressed: never ambiguous)."""

    def __init__(
        self,
        model: str,
        pool: UpstreamPool,
        readiness: Readiness,
        metrics: Metrics,
        assets: CodecAssets,
        *,
        names: tuple[str, ...],
        stream_format: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._model = model
        self._pool = pool
        self._readiness = readiness
        self._metrics = metrics
        self._assets = assets
        self._names = names  # what the upstream may list the model as in its index
        self._format = stream_format
        self._clock = clock
        self.pinned: str | None = None
        self._published: dict[str, PublishedMap] = {}
        self._loading: dict[str, asyncio.Task[MapDecoder]] = {}
        self._fetching: dict[str, asyncio.Task[bytes]] = {}
        self._bad: dict[str, float] = {}
        self._bad_until = 0.0
        self._seen_drift: set[str] = set()
        self._tasks: set[asyncio.Task[object]] = set()
        # Where the upstream refused Codec (server/control/codec_upstream.py): JSON for a while.
        self.refusals = RefusalMemory()
        readiness.update(Check(UPSTREAM_MAP_CHECK, False, "upstream_map_pending"))

    # --- what requests read ------------------------------------------------------------------

    def decoder(self, digest: str) -> MapDecoder | None:
        """The verified map `digest`, when it is loaded."""
        return self._assets.map(digest) if digest in self._published else None

    def published(self, digest: str) -> PublishedMap | None:
        """A verified map's bytes, to serve at this proxy's own discovery path."""
        return self._published.get(digest)

    def dictionary(self, digest: str) -> bytes | None:
        return self._assets.dictionary(digest)

    @property
    def vocab_size(self) -> int | None:
        """One past the pinned map's highest ID (None: nothing pinned yet)."""
        decoder = None if self.pinned is None else self._assets.map(self.pinned)
        return None if decoder is None else decoder.size

    def may_ask(self) -> bool:
        """Whether Codec may be asked of the upstream now: not for `BAD_SECONDS` after bytes
        that did not verify, since each such answer is generated twice (closed, then asked
        again as JSON)."""
        return self._clock() >= self._bad_until

    def zstd_dictionary(self) -> str | None:
        """The dictionary the pinned map lists for the format asked for, when it is held: only
        then may `zstd` be offered (an answer compressed with it could not be decoded
        otherwise)."""
        if self.pinned is None:
            return None
        for fmt, digest in self._assets.declared_dictionaries(self.pinned):
            if fmt == self._format and self._assets.dictionary(digest) is not None:
                return digest
        return None

    async def load_map(self, digest: str) -> MapDecoder:
        """The decoder of the map an answer names, fetched and verified if it is new, and the
        pin moved to it. `CodecIntegrityError` (bytes that are not the map named) or
        `MapUnavailable`."""
        decoder = self.decoder(digest)
        if decoder is None:
            task = self._loading.get(digest)
            if task is None:
                task = asyncio.create_task(self._load_map(digest), name=f"upstream-map-{digest}")
                self._loading[digest] = task
                task.add_done_callback(lambda done: self._settled(self._loading, digest, done))
            # One fetch for every request waiting on it; a request that leaves does not end it.
            decoder = await asyncio.shield(task)
        if digest != self.pinned:
            self._pin(digest)
        return decoder

    async def load_dictionary(self, digest: str) -> bytes:
        """A dictionary an answer names, fetched and verified if it is new."""
        data = self._assets.dictionary(digest)
        if data is not None:
            return data
        task = self._fetching.get(digest)
        if task is None:
            task = asyncio.create_task(self._load_dictionary(digest), name=f"zstd-dict-{digest}")
            self._fetching[digest] = task
            task.add_done_callback(lambda done: self._settled(self._fetching, digest, done))
        return await asyncio.shield(task)

    def drifted(self, digest: str) -> None:
        """An answer rendered with the map `digest` had an ID past its vocabulary: counted as
        drift, and the map fetched and verified again (now, in the background; an answer that
        names it meanwhile waits for that fetch) before another answer is rendered with it."""
        self._metrics.upstream_maps.labels(self._model, "drift").inc()
        published = self._published.pop(digest, None)
        self._assets.forget_map(digest)
        log.warning(
            "model %s: a Codec answer's token IDs went past the vocabulary of map %s it names: "
            "the upstream's IDs follow another map; fetching it again",
            self._model,
            published.header_value if published is not None else f"sha256:{digest}",
        )
        self._background(self._load_again(digest))

    # --- at start, and until something is pinned ---------------------------------------------

    async def pin_from_index(self) -> bool:
        """Pin the map the upstream's index lists for this model. True when the question is
        settled (pinned, or the index lists no map for the model), False to try again later."""
        try:
            index = await self._fetch(INDEX_PATH, MAX_INDEX_BYTES)
        except MapUnavailable as exc:
            if exc.code == "not_found":
                return self._unlisted("the upstream publishes no index.json")
            log.warning("model %s: the Codec upstream's index: %s", self._model, exc.message)
            return False
        try:
            pointer = pointer_for(read_index(index.data), self._names)
        except ProxyError as exc:
            log.warning("model %s: the Codec upstream's index: %s", self._model, exc.message)
            return False
        if pointer is None:
            return self._unlisted("the upstream's index.json lists no map for this model")
        try:
            await self.load_map(pointer.digest)
        except (CodecIntegrityError, MapUnavailable):
            return False  # counted and logged where it happened
        return True

    async def run(self) -> None:
        """Until something is pinned: the index again every `RETRY_SECONDS`."""
        while True:
            if self.pinned is not None or await self.pin_from_index():
                return
            await asyncio.sleep(RETRY_SECONDS)

    async def close(self) -> None:
        for task in [*self._loading.values(), *self._fetching.values(), *self._tasks]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- internal ----------------------------------------------------------------------------

    @staticmethod
    def _settled(loading: dict[str, Any], digest: str, task: asyncio.Task[Any]) -> None:
        loading.pop(digest, None)
        # Counted and logged where it was raised; its waiters may all have left meanwhile.
        if not task.cancelled():
            task.exception()

    def _unlisted(self, why: str) -> bool:
        if self.pinned is None:
            log.info("model %s: %s; its map is pinned from the first answer", self._model, why)
            self._readiness.update(
                Check(UPSTREAM_MAP_CHECK, True, "upstream_map_on_first_answer", why)
            )
        return True

    def _pin(self, digest: str) -> None:
        previous, self.pinned = self.pinned, digest
        published = self._published[digest]
        if previous is not None:
            self._metrics.upstream_maps.labels(self._model, "drift").inc()
            if digest not in self._seen_drift:
                self._seen_drift.add(digest)
                log.warning(
                    "model %s: the Codec upstream now names map %s (was sha256:%s); answers "
                    "are rendered with the map each names",
                    self._model,
                    published.header_value,
                    previous,
                )
        self._readiness.update(
            Check(UPSTREAM_MAP_CHECK, True, "upstream_map_pinned", published.header_value)
        )
        self._background(self._prefetch_dictionary())

    async def _load_map(self, digest: str) -> MapDecoder:
        body = await self._guarded(digest, lambda: self._fetch(map_path_by_digest(digest),
                                                                MAX_MAP_BYTES))  # fmt: skip
        try:
            # A map is megabytes of JSON: read off the loop (80 ms for SmolLM2's, 320 ms for
            # Llama-3's), once per digest.
            decoder = await asyncio.to_thread(
                lambda: self._assets.add_map(digest, body.data, sha256=body.sha256)
            )
        except CodecIntegrityError as exc:
            self._refused(digest, exc)
            raise
        self._published[digest] = PublishedMap(decoder.map_id, body.data, digest)
        self._bad.pop(digest, None)
        self._metrics.upstream_maps.labels(self._model, "pinned").inc()
        log.info("model %s: the Codec upstream's map %s is verified", self._model,
                 self._published[digest].header_value)  # fmt: skip
        return decoder

    async def _load_dictionary(self, digest: str) -> bytes:
        data = await self._guarded(digest, lambda: self._fetch(dictionary_url(digest),
                                                                MAX_DICTIONARY_BYTES))  # fmt: skip
        try:
            return self._assets.add_dictionary(digest, data.data, sha256=data.sha256)
        except CodecIntegrityError as exc:
            self._refused(digest, exc)
            raise

    async def _guarded(self, digest: str, fetch: Callable[[], Awaitable[ReadBody]]) -> ReadBody:
        until = self._bad.get(digest)
        if until is not None and self._clock() < until:
            raise CodecIntegrityError(
                f"sha256:{digest} did not verify a moment ago", code="hash_mismatch"
            )
        try:
            return await fetch()
        except MapUnavailable as exc:
            self._metrics.upstream_maps.labels(self._model, "unavailable").inc()
            log.warning("model %s: %s", self._model, exc.message)
            raise

    def _refused(self, digest: str, exc: CodecIntegrityError) -> None:
        event = exc.code or "hash_mismatch"
        self._metrics.upstream_maps.labels(self._model, event).inc()
        self._bad[digest] = self._bad_until = self._clock() + BAD_SECONDS
        log.error(
            "model %s: the Codec upstream serves other bytes than it names: %s; its answers "
            "naming sha256:%s are served from its JSON instead",
            self._model,
            exc.message,
            digest,
        )
        self._readiness.update(
            Check(UPSTREAM_MAP_CHECK, False, "upstream_map_mismatch", exc.message)
        )

    async def _prefetch_dictionary(self) -> None:
        if self.pinned is None:
            return
        for fmt, digest in self._assets.declared_dictionaries(self.pinned):
            if fmt == self._format:
                with contextlib.suppress(CodecIntegrityError, MapUnavailable):
                    await self.load_dictionary(digest)

    async def _load_again(self, digest: str) -> None:
        with contextlib.suppress(CodecIntegrityError, MapUnavailable):
            await self.load_map(digest)  # counted and logged where it failed

    def _background(self, work: Awaitable[object]) -> None:
        task: asyncio.Task[object] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(self, path: str, limit: int) -> ReadBody:
        """A discovery document of the upstream's, its content coding undone within `limit`
        as it arrives, and hashed."""
        try:
            async with asyncio.timeout(FETCH_SECONDS):
                async with self._pool.request(
                    "GET", path, headers=_FETCH_HEADERS, data=None
                ) as response:
                    status = response.status
                    if status != 200:
                        code = "not_found" if status == 404 else "unavailable"
                        raise MapUnavailable(f"GET {path} answered {status}", code=code)
                    reader = BodyReader(response.headers.get("Content-Encoding"), limit)
                    async for part in response.content.iter_any():
                        reader.feed(part)
                    return reader.flush()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MapUnavailable(f"GET {path} failed: {exc!r}") from exc
        except MapUnavailable:
            raise
        except ProxyError as exc:
            raise MapUnavailable(f"GET {path}: {exc.message}") from exc
