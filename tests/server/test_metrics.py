"""The proxy's metrics (proxy/server/telemetry/metrics.py): a child found again is not made
again, and what it counts is what prometheus_client's own child counts."""

from __future__ import annotations

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from proxy.server.telemetry.metrics import Metrics


def test_a_child_asked_for_again_is_found_without_prometheus_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = Metrics()
    first = metrics.requests.labels("/v1/completions", "passthrough", "200", "default")
    made: list[tuple[object, ...]] = []
    own = MetricWrapperBase.labels

    def counted(self: MetricWrapperBase, *values: object, **named: object) -> MetricWrapperBase:
        made.append(values)
        return own(self, *values, **named)

    monkeypatch.setattr(MetricWrapperBase, "labels", counted)
    again = metrics.requests.labels("/v1/completions", "passthrough", "200", "default")
    assert again is first
    assert made == []
    other = metrics.requests.labels("/v1/completions", "codec", "200", "default")
    assert made == [("/v1/completions", "codec", "200", "default")]
    # By name, prometheus_client's own way, the same child.
    named = metrics.requests.labels(
        route="/v1/completions", mode="codec", status="200", model="default"
    )
    assert named is other


def test_kept_children_count_into_the_exposition_and_removal_forgets_them() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.ttft.labels("codec", "default").observe(0.01)
    metrics.streams.labels("default", "codec", "complete").inc()
    text = metrics.exposition()[0].decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [count] = [
        s.value
        for s in families["codec_proxy_time_to_first_token_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert count == 3
    gone = metrics.streams.labels("default", "codec", "complete")
    metrics.streams.remove("default", "codec", "complete")
    assert metrics.streams.labels("default", "codec", "complete") is not gone
    metrics.streams.clear()
    assert 'end="complete"' not in metrics.exposition()[0].decode()
