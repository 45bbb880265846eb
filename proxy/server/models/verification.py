"""Continuous verification at the edge: a sampled share of Codec streams is checked as served.

The IDs a sampled stream sends are decoded with the model's *published* map (the bytes clients
download, decoded as a map-driven client decodes them: proxy/core/verify/) and compared with the
text the upstream streamed. The tokenizer object that produced the IDs would agree with them by
construction; the map is what a client trusts, so it is what is checked.

A mismatch is counted (`codec_proxy_verify_mismatches_total{model, token_source}`) and logged
with the request's ids (the proxy's own, and the client's `X-Request-Id` when it sent one) and
the first differing byte offset, never the text. With
`verify_refuse_after` set, that many mismatches within `verify_window` refuse Codec for the
model until a reload or a clean drift check. Only Codec: the refusal's readiness check stays
ready, because what any client's requests can bring about must not take the pod out of a
Service (and every model's JSON with it). Lifting a refusal forgets the mismatches that caused
it, so that it takes `verify_refuse_after` new ones to refuse again; mismatches that have not
(yet) refused are kept whatever the drift check says, since it does not look at the map.

The decoder is built once per map, in a worker thread, the first time a stream of the model is
sampled (80 ms for SmolLM2's map, 320 ms for Llama-3's): until it exists, sampled streams are
counted as skipped rather than held up.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Final

from proxy.core.backend.readiness import Check, Readiness
from proxy.core.maps.tokenizer_map import PublishedMap
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.verify.sampling import MismatchWindow, Sampler
from proxy.core.verify.verifier import Verification
from proxy.server.telemetry.metrics import Metrics
from proxy.settings import Settings

log = logging.getLogger("codec_proxy")

VERIFICATION_CHECK: Final = "verification"
REFUSED_REASON: Final = "verification_mismatch"

# One decoder per map digest in the process: models (and apps, in tests) sharing a map share it.
_DECODERS: dict[str, MapDecoder] = {}
_BUILDING: dict[str, asyncio.Task[MapDecoder]] = {}


def verdict_label(verdict: Verification | None) -> str:
    """A sampled stream's verdict as the metric and the trace name it (None: skipped)."""
    if verdict is None:
        return "skipped"
    return "match" if verdict.agreed else "mismatch"


class ModelVerification:
    """One model's sampling, decoder and mismatch window."""

    def __init__(self, model: str, published: PublishedMap, readiness: Readiness) -> None:
        self._model = model
        self._published = published
        self._readiness = readiness
        self._window: MismatchWindow | None = None

    def prepare(self) -> None:
        """Start building the decoder (at start, when streams will be sampled), off the loop."""
        digest = self._published.digest
        if digest in _DECODERS:
            return
        building = _BUILDING.get(digest)
        # A build of another event loop (an app that stopped before it finished) never ends.
        if building is None or building.get_loop() is not asyncio.get_running_loop():
            _BUILDING[digest] = asyncio.create_task(self._build(), name=f"map-decoder-{digest}")

    def decoder_for_stream(self, rate: float) -> tuple[bool, MapDecoder | None]:
        """Whether this stream is sampled, and the decoder to verify it with (None while the
        decoder is still being built: the stream is then counted as skipped)."""
        if not Sampler(rate, random.random).pick():
            return False, None
        decoder = _DECODERS.get(self._published.digest)
        if decoder is None:
            self.prepare()
        return True, decoder

    async def _build(self) -> MapDecoder:
        published = self._published
        try:
            decoder = await asyncio.to_thread(MapDecoder.from_map, published.body)
            _DECODERS[published.digest] = decoder
            return decoder
        finally:
            if _BUILDING.get(published.digest) is asyncio.current_task():
                del _BUILDING[published.digest]

    def record(
        self,
        verdict: Verification | None,
        *,
        token_source: str,
        request: str,
        settings: Settings,
        metrics: Metrics,
        now: float,
    ) -> bool:
        """Account one sampled stream's verdict (None: skipped); True when it made the model
        refuse Codec (the caller republishes the gauges). `request` names the stream's request
        by its ids (`RequestRecord.described`): the proxy's own, and the client's, which is
        only the client's word and may be another client's too."""
        model = self._model
        metrics.verify_streams.labels(model, verdict_label(verdict)).inc()
        if verdict is None or verdict.agreed:
            return False
        metrics.verify_mismatches.labels(model, token_source).inc()
        # The offset and the request ids find the stream in the logs; the text never is logged.
        log.error(
            "verification mismatch: request %s, model %s, token source %s: the IDs sent, decoded "
            "with map %s, differ from the upstream's text at byte %s (%d bytes agreed)",
            request,
            model,
            token_source,
            self._published.header_value,
            verdict.first_difference,
            verdict.compared_bytes,
        )
        # Streams that were in flight when the refusal began may still report: already said.
        if not self._tripped(settings, now) or self.refused:
            return False
        detail = (
            f"{settings.verify_refuse_after} verification mismatch(es) within "
            f"{settings.verify_window:g}s: Codec is refused until a reload or a clean drift "
            "check; JSON and readiness are not affected"
        )
        log.error("model %s: %s", model, detail)
        self._readiness.update(
            Check(VERIFICATION_CHECK, True, REFUSED_REASON, detail, refuses_codec=True)
        )
        return True

    @property
    def refused(self) -> bool:
        return self._readiness.get(VERIFICATION_CHECK) is not None

    def _tripped(self, settings: Settings, now: float) -> bool:
        threshold, seconds = settings.verify_refuse_after, settings.verify_window
        window = self._window
        if window is None or (window.threshold, window.window_seconds) != (threshold, seconds):
            window = self._window = MismatchWindow(threshold, seconds)
        return window.record(now)

    def lift(self) -> None:
        """A reload or a clean drift check ends a refusal, and the window starts again empty."""
        if not self.refused:
            return
        if self._window is not None:
            self._window.reset()
        log.info("model %s: Codec is served again after verification mismatches", self._model)
        self._readiness.discard(VERIFICATION_CHECK)
