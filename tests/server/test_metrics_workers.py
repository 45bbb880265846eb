"""`/metrics` with several workers: every worker's sample files merged, whatever state the
files are in when it is asked (proxy/server/telemetry/metrics.py).

A worker creates its file of a kind of metric when it first needs one: at start, and for
histograms and live gauges at its first request. For an instant the new file is empty, before
prometheus_client sizes it; prometheus_client's own collector fails on it (`struct.error`), and
`/metrics` answered 500 when a scrape came then (seen with two workers on a loaded machine,
tests/test_lifecycle.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from proxy.server.telemetry.metrics import Metrics

HELP = "Requests answered, by route, mode (codec|passthrough|local), status code and model."
LABELS = {"route": "/v1/completions", "mode": "passthrough", "status": "200", "model": "default"}


def worker_counted(directory: Path, pid: int, requests: float) -> None:
    """Worker `pid`'s counter file, as prometheus_client writes it, with its requests."""
    samples = MmapedDict(str(directory / f"counter_{pid}.db"))
    key = mmap_key(
        "codec_proxy_requests",
        "codec_proxy_requests_total",
        list(LABELS),
        list(LABELS.values()),
        HELP,
    )
    samples.write_value(key, requests, 0.0)
    samples.close()


def requests_total(exposition: bytes) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition.decode())
        for sample in family.samples
        if sample.name == "codec_proxy_requests_total" and sample.labels == LABELS
    )


@pytest.fixture
def samples_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    return tmp_path


def test_every_workers_samples_are_merged(samples_dir: Path) -> None:
    worker_counted(samples_dir, 101, 12)
    worker_counted(samples_dir, 102, 18)
    body, content_type = Metrics().exposition()
    assert content_type.startswith("text/plain")
    assert requests_total(body) == 30


@pytest.mark.parametrize(
    "being_created",
    [b"", b"\0" * 4096],  # just created; sized, nothing written yet
    ids=["empty", "sized"],
)
def test_a_file_a_worker_is_creating_fails_nothing(samples_dir: Path, being_created: bytes) -> None:
    worker_counted(samples_dir, 101, 12)
    worker_counted(samples_dir, 102, 18)
    (samples_dir / "histogram_103.db").write_bytes(being_created)
    (samples_dir / "gauge_livesum_103.db").write_bytes(being_created)
    body, _ = Metrics().exposition()
    assert requests_total(body) == 30
