"""The drift check's IO: the backend's `/tokenize` and `/v1/models`, at start and then on a timer.

The verdict logic is `proxy.core.backend.drift`; this module asks the backend, keeps the readiness
check up to date, and logs what changed. A check that cannot conclude (backend down, 5xx, a
broken answer) keeps the previous verdict and is retried sooner than the interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp

from proxy.core.backend import drift
from proxy.core.backend.drift import DriftState, DriftVerdict
from proxy.core.backend.models import find_model
from proxy.core.backend.readiness import Readiness
from proxy.core.backend.tokenize_api import (
    DIALECTS,
    TOKENIZE_PATH,
    TokenizeDialect,
    parse_tokens,
)
from proxy.core.errors import ProxyError, UpstreamProtocolError
from proxy.server.data.upstreams import UpstreamPool
from proxy.server.models.upstream_models import UpstreamModels
from proxy.tokenizers.probes import PROBE_STRINGS
from proxy.tokenizers.vocabulary import Vocabulary

log = logging.getLogger("codec_proxy")

# Statuses that mean "this backend has no /tokenize", not "it is failing".
NO_ENDPOINT = frozenset({404, 405, 501})
# Probes in flight at once: a check is a few hundred tiny requests; the backend is generating.
CONCURRENCY = 4
REQUEST_SECONDS = 10.0
# After a check that could not conclude, try again after this long (or the interval if shorter).
RETRY_SECONDS = 10.0
_HEADERS = (
    ("Content-Type", "application/json"),
    ("Accept", "application/json"),
    ("Accept-Encoding", "identity"),  # the session does not decompress (upstream.py)
)


class Inconclusive(Exception):
    """This round could not decide; the reason is the message."""


# What a round may fail with without being a bug: the backend is down, slow or answers badly.
_ROUND_FAILURES = (Inconclusive, aiohttp.ClientError, TimeoutError)


class NoTokenizeEndpoint(Exception):
    """The backend has no `/tokenize` in a dialect we know."""


class DriftMonitor:
    """Compares the proxy's tokenizer with the backend's, and records the verdict."""

    def __init__(
        self,
        upstream: UpstreamPool,
        models: UpstreamModels,
        vocabulary: Vocabulary,
        readiness: Readiness,
        *,
        model: str | None,
        on_verdict: Callable[[], None] = lambda: None,
    ) -> None:
        self._upstream = upstream
        self._on_verdict = on_verdict
        self._models = models
        self._readiness = readiness
        self._model = model
        self._vocab_size = vocabulary.loaded.vocab_size
        self.probes = drift.drift_probes(PROBE_STRINGS, vocabulary.loaded.special_tokens)
        encoded = vocabulary.loaded.tokenizer.encode_batch(
            list(self.probes), add_special_tokens=False
        )
        self._proxy_ids = [encoding.ids for encoding in encoded]
        self.dialect: TokenizeDialect | None = None
        self.verdict = drift.pending("the first drift check has not finished")
        self._warned_unsupported = False
        self._failing = False
        # When the next round starts (time.monotonic()); None until `run` schedules one.
        self.next_round: float | None = None
        readiness.update(self.verdict.check())

    async def _post(self, dialect: TokenizeDialect, text: str) -> tuple[int, bytes]:
        body = dialect.request_body(text, self._model)
        async with asyncio.timeout(REQUEST_SECONDS):
            async with self._upstream.request(
                "POST", TOKENIZE_PATH, headers=_HEADERS, data=body
            ) as response:
                return response.status, await response.read()

    async def _detect(self) -> TokenizeDialect:
        """The dialect the backend speaks, found with the first probe."""
        text = self.probes[0]
        statuses = []
        for dialect in DIALECTS:
            status, body = await self._post(dialect, text)
            statuses.append(f"{dialect.name}-shaped request: {status}")
            if status in NO_ENDPOINT:
                raise NoTokenizeEndpoint(f"{TOKENIZE_PATH} answered {status}")
            if status >= 500:
                raise Inconclusive(f"{TOKENIZE_PATH} answered {status}")
            if status == 200:
                with contextlib.suppress(UpstreamProtocolError):
                    if parse_tokens(body):
                        return dialect
        raise NoTokenizeEndpoint(f"{TOKENIZE_PATH} speaks no known dialect ({'; '.join(statuses)})")

    async def _tokenize(
        self, dialect: TokenizeDialect, text: str, gate: asyncio.Semaphore
    ) -> list[int]:
        async with gate:
            status, body = await self._post(dialect, text)
        if status != 200:
            raise Inconclusive(f"{TOKENIZE_PATH} answered {status} for {text!r}")
        try:
            return parse_tokens(body)
        except UpstreamProtocolError as exc:
            raise Inconclusive(exc.message) from exc

    async def _backend_vocab_size(self) -> int | None:
        try:
            listing = await self._models.listing(fresh=True)
        except ProxyError:
            return None
        entry = find_model(listing, self._model)
        return entry.vocab_size if entry is not None else None

    async def _round(self) -> DriftVerdict:
        if self.dialect is None:
            self.dialect = await self._detect()
        gate = asyncio.Semaphore(CONCURRENCY)
        dialect = self.dialect
        try:
            # A TaskGroup, not gather(): the first failure cancels the probes still pending.
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._tokenize(dialect, text, gate)) for text in self.probes
                ]
        except ExceptionGroup as failures:
            expected, unexpected = failures.split(_ROUND_FAILURES)
            if unexpected is not None or expected is None:
                raise
            first = expected.exceptions[0]
            raise Inconclusive(str(first) or type(first).__name__) from failures
        return drift.compare(
            self.probes,
            self._proxy_ids,
            [task.result() for task in tasks],
            proxy_vocab_size=self._vocab_size,
            backend_vocab_size=await self._backend_vocab_size(),
            backend=dialect.name,
        )

    async def check(self) -> bool:
        """One round: record the verdict and return True, or keep the last one and return False."""
        try:
            verdict = await self._round()
        except NoTokenizeEndpoint as exc:
            verdict = DriftVerdict(
                DriftState.UNSUPPORTED,
                f"the backend has no usable {TOKENIZE_PATH} ({exc}); the tokenizer is not checked",
            )
        except _ROUND_FAILURES as exc:
            # Unknown dialect again next time: the backend may have been replaced meanwhile.
            self.dialect = None
            # Warn when it starts; a backend down for an hour is not 360 warnings.
            level = logging.DEBUG if self._failing else logging.WARNING
            self._failing = True
            reason = str(exc) or type(exc).__name__
            log.log(level, "tokenizer drift check could not conclude: %s", reason)
            return False
        self._failing = False
        self._record(verdict)
        return True

    def _record(self, verdict: DriftVerdict) -> None:
        previous, self.verdict = self.verdict, verdict
        self._readiness.update(verdict.check())
        self._on_verdict()
        if verdict.state is DriftState.MISMATCHED:
            if previous.differences != verdict.differences or previous.state != verdict.state:
                log.error("tokenizer drift: %s", verdict.detail)
                for difference in verdict.differences:
                    log.error("  probe %s", difference.describe())
                hidden = verdict.differing - len(verdict.differences)
                if hidden > 0:
                    log.error("  ... and %d more probe strings", hidden)
        elif verdict.state is DriftState.UNSUPPORTED:
            if not self._warned_unsupported:
                log.warning("tokenizer drift check: %s", verdict.detail)
                self._warned_unsupported = True
        elif previous.state != verdict.state:
            log.info("tokenizer drift check: %s", verdict.detail)

    async def run(self, interval: float, *, concluded: bool) -> None:
        """Check every `interval` seconds, sooner after a round that did not conclude."""
        while True:
            delay = interval if concluded else min(interval, RETRY_SECONDS)
            self.next_round = time.monotonic() + delay
            await asyncio.sleep(delay)
            concluded = await self.check()
