"""Prometheus metrics, `codec_proxy_*`, with low-cardinality labels only.

Labels take values from small fixed sets (route names, mode, status class, encoding, phase,
kind), never from request content, so a scrape stays small whatever the traffic; safety-policy
rules, prompts and tokens never become labels.

With several workers (`--workers N`) every worker writes its samples to files in a directory the
supervisor shares (prometheus_client's multiprocess mode, `PROMETHEUS_MULTIPROC_DIR`), and
whichever worker answers `/metrics` aggregates all of them, so the numbers are the machine's,
not one worker's. A worker creates its file of a kind of metric when it first needs it (at
start, or at its first request for histograms), and the file is empty for an instant before
prometheus_client sizes it: `/metrics` leaves such a file out (it holds no sample yet) instead of
failing on it, as prometheus_client's own collector does.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from typing import Self

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client import Counter as _Counter
from prometheus_client import Gauge as _Gauge
from prometheus_client import Histogram as _Histogram
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Seconds. Time to first token spans loopback (sub-ms) to long prefills (minutes).
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Time inside the proxy per upstream chunk: microseconds matter here.
_OVERHEAD_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
)  # fmt: skip


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


# A samples file starts with 4 bytes saying how much of it is used, then 4 of padding.
_SAMPLES_HEADER = 8


class WorkersCollector(Collector):
    """Every worker's samples in `path`, merged as prometheus_client's MultiProcessCollector
    merges them, from the files their workers have finished creating."""

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self) -> Iterable[Metric]:
        files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if _created(f)]
        merged: Iterable[Metric] = prometheus_multiprocess.MultiProcessCollector.merge(
            files, accumulate=True
        )
        return merged


def _created(path: str) -> bool:
    """Whether a samples file has its header: between its creation and prometheus_client
    sizing it, it is empty (files never shrink; a dead worker's live gauges are removed)."""
    try:
        return os.stat(path).st_size >= _SAMPLES_HEADER
    except FileNotFoundError:
        return False


class _KeptChildren:
    """`labels()` that finds a child it made before with one dictionary look-up.

    prometheus_client's own turns every value into a string, takes a lock and builds a tuple on
    every call: several microseconds, and a streamed request asks for a dozen children. Label
    values are bounded (see above), so what is kept is bounded too; nothing here removes a
    child (`remove`, `clear`), and those drop what is kept all the same.
    """

    _kept: dict[tuple[object, ...], Self]

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Self:
        if labelkwargs:
            return super().labels(*labelvalues, **labelkwargs)  # type: ignore[misc, no-any-return]
        try:
            return self._kept[labelvalues]
        except AttributeError:
            self._kept = {}
        except KeyError:
            pass
        child: Self = super().labels(*labelvalues)  # type: ignore[misc]
        self._kept[labelvalues] = child
        return child

    def remove(self, *labelvalues: object) -> None:
        self._kept = {}
        super().remove(*labelvalues)  # type: ignore[misc]

    def clear(self) -> None:
        self._kept = {}
        super().clear()  # type: ignore[misc]


class Counter(_KeptChildren, _Counter):
    pass


class Gauge(_KeptChildren, _Gauge):
    pass


class Histogram(_KeptChildren, _Histogram):
    pass


class Metrics:
    """Every metric the proxy exports, registered in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "codec_proxy_requests",
            "Requests answered, by route, mode (codec|passthrough|policed|rendered|local), status "
            "code and model.",
            ["route", "mode", "status", "model"],
            registry=r,
        )
        self.active_streams = Gauge(
            "codec_proxy_active_streams",
            "Requests currently being proxied to an upstream.",
            ["mode", "model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ttft = Histogram(
            "codec_proxy_time_to_first_token_seconds",
            "From request received to the first body bytes sent to the client.",
            ["mode", "model"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.inter_token_gap = Histogram(
            "codec_proxy_inter_token_gap_seconds",
            "Time between two successive writes of a stream to its client.",
            ["mode"],
            buckets=_GAP_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "codec_proxy_overhead_seconds",
            "Mean time spent inside the proxy per upstream chunk (parse, retokenize, encode), "
            "observed once per stream.",
            ["mode", "model"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "codec_proxy_upstream_errors",
            "Upstream failures by kind (connect, timeout, closed, protocol, status_5xx) and model.",
            ["kind", "model"],
            registry=r,
        )
        self.retries = Counter(
            "codec_proxy_retries",
            "Requests sent again: to another upstream after a failed connect, on a fresh "
            "connection after a stale kept-alive one, or as resend_unanswered_requests allows.",
            registry=r,
        )
        self.ejections = Counter(
            "codec_proxy_upstream_ejections",
            "Upstreams taken out of rotation after consecutive failures.",
            registry=r,
        )
        self.client_disconnects = Counter(
            "codec_proxy_client_disconnects",
            "Clients that left before their response ended, by phase.",
            ["phase"],
            registry=r,
        )
        self.timeouts = Counter(
            "codec_proxy_timeouts",
            "Timeouts by kind (connect, ttft, idle, write, request_head, request_body).",
            ["kind"],
            registry=r,
        )
        self.bytes_in = Counter(
            "codec_proxy_upstream_bytes",
            "Body bytes received from upstreams, by mode (codec, passthrough, policed, rendered: "
            "a Codec upstream's frames) and model.",
            ["mode", "model"],
            registry=r,
        )
        self.bytes_out = Counter(
            "codec_proxy_client_bytes",
            "Body bytes sent to clients, by mode, content encoding and model.",
            ["mode", "encoding", "model"],
            registry=r,
        )
        self.tokens = Counter(
            "codec_proxy_tokens",
            "Token IDs sent in Codec frames, by stream format, model and where they came from.",
            ["format", "model", "token_source"],
            registry=r,
        )
        self.rejected = Counter(
            "codec_proxy_load_shed",
            "Requests refused with 503 because a stream budget was spent: the model's share of "
            "max_streams (budget=model) or max_streams for every model together (process).",
            ["model", "budget"],
            registry=r,
        )
        # Each worker's, summed over workers like codec_proxy_active_streams, which counts what
        # the budgets hold: `sum by (model)` of that over this is a model's share in use.
        self.model_max_streams = Gauge(
            "codec_proxy_model_max_streams",
            "Upstream requests the model may have in flight: its share of max_streams.",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.max_streams = Gauge(
            "codec_proxy_max_streams",
            "Upstream requests every model together may have in flight (max_streams).",
            registry=r,
            multiprocess_mode="livesum",
        )

        # --- the native steady path (proxy/core/steady; docs/ARCHITECTURE.md) ---
        self.data_path = Gauge(
            "codec_proxy_data_path",
            "1 for the path that serves steady upstream reads: native (the C step) or python "
            "(CODEC_PROXY_NO_EXTENSIONS=1).",
            ["path"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.native_reads = Counter(
            "codec_proxy_native_reads",
            "Upstream reads the native step turned into client bytes itself, by stream mode.",
            ["mode"],
            registry=r,
        )

        # --- rolling Codec out (docs/ROLLOUT.md) ---
        self.codec_requests = Counter(
            "codec_proxy_codec_requests",
            "Codec streams started, by model, stream format, client version (bucketed to the "
            "versions the proxy knows, absent, other) and content coding.",
            ["model", "format", "client_version", "encoding"],
            registry=r,
        )
        self.bytes_saved = Counter(
            "codec_proxy_codec_bytes_saved",
            "Upstream body bytes minus bytes sent to the client, per Codec stream.",
            ["model", "format"],
            registry=r,
        )
        self.codec_refused = Counter(
            "codec_proxy_codec_refused",
            "Codec requests refused before any upstream contact, by model and reason.",
            ["model", "reason"],
            registry=r,
        )
        self.streams = Counter(
            "codec_proxy_streams",
            "Streamed upstream answers that ended, by model, mode and how they ended "
            "(complete, error, client_disconnect, policy_stop, shutdown, slow_client).",
            ["model", "mode", "end"],
            registry=r,
        )
        self.verify_streams = Counter(
            "codec_proxy_verify_streams",
            "Codec streams verified against the published map, by model and result "
            "(match, mismatch, skipped).",
            ["model", "result"],
            registry=r,
        )
        self.verify_mismatches = Counter(
            "codec_proxy_verify_mismatches",
            "Verified Codec streams whose IDs, decoded with the published map, differ from "
            "the upstream's text.",
            ["model", "token_source"],
            registry=r,
        )
        # 0/1 per model. Every worker checks on its own: the highest value says "some worker".
        self.drift_detected = Gauge(
            "codec_proxy_drift_detected",
            "1 while the model's tokenizer drift check says the backend tokenizes differently.",
            ["model"],
            registry=r,
            multiprocess_mode="max",
        )
        self.codec_available = Gauge(
            "codec_proxy_codec_available",
            "1 while Codec is served for the model, 0 while it is refused (drift, "
            "verification, disabled).",
            ["model"],
            registry=r,
            multiprocess_mode="min",
        )
        self.model_ready = Gauge(
            "codec_proxy_model_ready",
            "1 while every readiness check of the model passes.",
            ["model"],
            registry=r,
            multiprocess_mode="min",
        )

        # --- a Codec upstream, its frames rendered as JSON (docs/DEPLOY.md "Codec on the long
        # hop"); `upstream_bytes{mode="rendered"}` over `rendered_tokens` is the hop's cost ---
        self.codec_upstream_requests = Counter(
            "codec_proxy_codec_upstream_requests",
            "Generation requests to a model whose upstream speaks Codec, by model and what became "
            "of them: rendered (asked as Codec, rendered as JSON), relayed (not askable as Codec: "
            "n>1, logprobs, a Codec client's own request...), upstream_error (its error relayed), "
            "answered_json (the upstream ignored stream_format), refused (403/426/503 refusal: "
            "asked again as JSON), map_unavailable, map_mismatch (no verified map or dictionary: "
            "asked again as JSON), skipped (Codec not asked after a refusal, for a while).",
            ["model", "result"],
            registry=r,
        )
        self.rendered_tokens = Counter(
            "codec_proxy_rendered_tokens",
            "Token IDs received in a Codec upstream's frames and rendered as JSON, by model and "
            "frame format.",
            ["model", "format"],
            registry=r,
        )
        self.upstream_maps = Counter(
            "codec_proxy_upstream_maps",
            "A Codec upstream's tokenizer maps and dictionaries, by model and event: pinned (a "
            "map fetched and verified by its digest), drift (an answer named another map than "
            "the pinned one), unavailable (could not be fetched), hash_mismatch (bytes that do "
            "not hash to the digest named), not_a_map.",
            ["model", "event"],
            registry=r,
        )
        self.config_reloads = Counter(
            "codec_proxy_config_reloads",
            "Configuration reloads (SIGHUP), by result (ok, error).",
            ["result"],
            registry=r,
        )

    def prepare(self, models: Iterable[str]) -> None:
        """Export the counters alerts watch at 0 from the start, so their first increase is
        an increase (a series that appears at 1 has no earlier sample for `increase()`)."""
        for model in models:
            for source in ("backend", "retokenized"):
                self.verify_mismatches.labels(model, source)
            for budget in ("model", "process"):
                self.rejected.labels(model, budget)
            # Alerts watch these: a Codec upstream serving bytes that do not match their digest.
            for event in ("hash_mismatch", "drift"):
                self.upstream_maps.labels(model, event)
        for result in ("ok", "error"):
            self.config_reloads.labels(result)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition for `/metrics`, across all workers when there are several."""
        path = multiprocess_dir()
        if path:
            registry = CollectorRegistry()
            registry.register(WorkersCollector(path))
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


METRICS = web.AppKey("metrics", Metrics)
