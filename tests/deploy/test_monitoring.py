"""deploy/monitoring/: the Grafana dashboard, the alerting rules and their PrometheusRule.

Checked with the real tools: `promtool` checks and unit-tests the rules, and a real Prometheus
scrapes proxies serving test traffic, so that every dashboard query is shown to return data from
what the proxy really exports. The metric names and labels below are the contract the dashboard
and the alerts are written against (docs/ROLLOUT.md).

promtool and prometheus come from Debian's `prometheus` package (.ci/run installs it, and fails
when it cannot in CI). Without them the tests that need them skip, except in CI (`CI=true`), where
they fail: these are the only tests of the alert rules and of the dashboard's PromQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any, NoReturn

import aiohttp
import pytest
import yaml
from aiohttp import web

from proxy import assets
from proxy.embedded import free_port
from proxy.server import create_app
from proxy.server.models.live import LIVE
from proxy.server.process.reload import reload
from proxy.tokenizers import LoadedTokenizer, load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.fake_upstream import Capture, FakeUpstream, Script, load_capture
from tests.server.conftest import (
    AiohttpClient,
    AiohttpServer,
    ProxyClient,
    app_of,
)
from tests.server.support import with_swapped_map_ids
from tests.server.test_drift import TokenizingBackend

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "codec-proxy-dashboard.json"
ALERTS = MONITORING / "codec-proxy-alerts.yaml"
ALERT_TESTS = MONITORING / "codec-proxy-alerts.test.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
ROLLOUT = ROOT / "docs" / "ROLLOUT.md"

# Every metric the proxy exports, as exposed, with its labels: what the dashboard and the rules
# may use. Prometheus adds `job` and `instance` to each.
METRICS: dict[str, frozenset[str]] = {
    name: frozenset(labels.split())
    for name, labels in {
        "codec_proxy_requests_total": "route mode status model",
        "codec_proxy_active_streams": "mode model",
        "codec_proxy_time_to_first_token_seconds_bucket": "mode model le",
        "codec_proxy_time_to_first_token_seconds_sum": "mode model",
        "codec_proxy_time_to_first_token_seconds_count": "mode model",
        "codec_proxy_inter_token_gap_seconds_bucket": "mode le",
        "codec_proxy_overhead_seconds_bucket": "mode model le",
        "codec_proxy_upstream_errors_total": "kind model",
        "codec_proxy_retries_total": "",
        "codec_proxy_upstream_ejections_total": "",
        "codec_proxy_client_disconnects_total": "phase",
        "codec_proxy_timeouts_total": "kind",
        "codec_proxy_load_shed_total": "model budget",
        "codec_proxy_model_max_streams": "model",
        "codec_proxy_max_streams": "",
        "codec_proxy_upstream_bytes_total": "mode model",
        "codec_proxy_client_bytes_total": "mode encoding model",
        "codec_proxy_tokens_total": "format model token_source",
        "codec_proxy_codec_requests_total": "model format client_version encoding",
        "codec_proxy_codec_bytes_saved_total": "model format",
        "codec_proxy_codec_refused_total": "model reason",
        "codec_proxy_verify_streams_total": "model result",
        "codec_proxy_verify_mismatches_total": "model token_source",
        "codec_proxy_drift_detected": "model",
        "codec_proxy_codec_available": "model",
        "codec_proxy_model_ready": "model",
        "codec_proxy_streams_total": "model mode end",
        "codec_proxy_config_reloads_total": "result",
        "codec_proxy_data_path": "path",
        "codec_proxy_native_reads_total": "mode",
    }.items()
}
TARGET_LABELS = frozenset({"job", "instance"})

METRIC_NAME = re.compile(r"codec_proxy_[a-z_]+")
# A metric with its label matchers: `name{a="x", b=~"y"}`.
SELECTOR = re.compile(r"(codec_proxy_[a-z_]+)\s*\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
TEMPLATE_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
# What Grafana substitutes in a query, as the Prometheus test evaluates it: every model, and
# windows wide enough to hold both waves of traffic at a 1 s scrape interval.
GRAFANA_VARIABLES = {
    "model": ".*",
    "__rate_interval": "30s",
    "__interval": "30s",
    "__range": "1m",
}
RUNBOOK = re.compile(r"\$\{RUNBOOK_BASE_URL\}/docs/ROLLOUT\.md#([a-z0-9-]+)")


# --------------------------------------------------------------------------- the files


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that queries (rows only group them), collapsed rows' panels included."""
    panels = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


@dataclasses.dataclass(frozen=True)
class Query:
    panel: str
    ref_id: str
    expr: str
    legend: str

    @property
    def name(self) -> str:
        return f"{self.panel!r} {self.ref_id}"

    def evaluable(self) -> str:
        """The expression as Grafana sends it, with this module's values for its variables."""

        def value(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            assert name in GRAFANA_VARIABLES, f"{self.name}: unknown variable ${name}"
            return GRAFANA_VARIABLES[name]

        return TEMPLATE_VARIABLE.sub(value, self.expr)


def dashboard_queries() -> list[Query]:
    return [
        Query(panel["title"], target["refId"], target["expr"], target.get("legendFormat", ""))
        for panel in query_panels(load_dashboard())
        for target in panel["targets"]
    ]


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def metric_problems(where: str, expr: str) -> list[str]:
    """What in `expr` is not in the contract: unknown metrics, labels no metric of it has."""
    problems = []
    names = set(METRIC_NAME.findall(expr))
    unknown = sorted(names - METRICS.keys())
    if unknown:
        problems.append(f"{where}: unknown metrics {unknown}")
    known = TARGET_LABELS.union(*(METRICS.get(n, frozenset()) for n in names))
    for name, matchers in SELECTOR.findall(expr):
        extra = (
            set(MATCHER_LABEL.findall(matchers)) - METRICS.get(name, frozenset()) - TARGET_LABELS
        )
        if extra:
            problems.append(f"{where}: {name} has no label {sorted(extra)}")
    for grouping in GROUPING.findall(expr):
        extra = {label.strip() for label in grouping.split(",") if label.strip()} - known
        if extra:
            problems.append(f"{where}: grouping by {sorted(extra)}, which none of {names} has")
    return problems


def github_anchors(markdown: str) -> list[str]:
    """The anchors GitHub gives the headings of a Markdown document, duplicates numbered."""
    anchors, seen = [], dict[str, int]()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = re.match(r"#{1,6} (.+)", line)
        if in_code or heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.append(slug if count == 0 else f"{slug}-{count}")
    return anchors


def markdown_section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n{heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else None]


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query"
    assert model["definition"] == "label_values(codec_proxy_requests_total, model)"
    assert model["query"]["query"] == model["definition"]
    # "All" must mean every model, also those no longer running, hence a regex, not a list.
    assert model["includeAll"]
    assert model["allValue"] == ".*"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]] + [
        p["id"] for row in dashboard["panels"] for p in row.get("panels", [])
    ]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in query_panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"{panel['title']!r} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), f"{panel['title']!r} {target['refId']}: no expr"
            assert target["datasource"] == panel["datasource"]
    assert len(panels) == len(query_panels(dashboard))  # no collapsed rows hide any
    # Every row of docs/ROLLOUT.md's "The dashboard" is one here, and the other way round.
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    dashboard_section = markdown_section(ROLLOUT.read_text(), "## The dashboard")
    documented = re.findall(r"^### (.+)$", dashboard_section, re.MULTILINE)
    assert rows == documented


def test_every_query_uses_only_the_contract() -> None:
    problems = []
    for query in dashboard_queries():
        problems += metric_problems(query.name, query.expr)
        # Every metric that has a model label follows the model picker.
        for name, matchers in SELECTOR.findall(query.expr):
            if "model" in METRICS.get(name, ()) and 'model=~"$model"' not in matchers:
                problems.append(f"{query.name}: {name} ignores $model")
        for name in set(METRIC_NAME.findall(query.expr)):
            if "model" in METRICS.get(name, ()) and not re.search(rf"{name}\s*\{{", query.expr):
                problems.append(f"{query.name}: {name} ignores $model")
    for rule in alert_rules():
        problems += metric_problems(rule["alert"], rule["expr"])
    assert not problems, "\n".join(problems)


def test_every_alert_says_what_it_is_and_links_its_runbook() -> None:
    anchors = github_anchors(ROLLOUT.read_text())
    alerts_section = markdown_section(ROLLOUT.read_text(), "## Alerts")
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))
    assert set(names) == {
        "CodecProxyTokenizerDrift",
        "CodecProxyVerificationMismatch",
        "CodecProxyUpstreamErrors",
        "CodecProxyStreamsEndingInError",
        "CodecProxyConfigReloadFailed",
    }
    for rule in alert_rules():
        annotations = rule["annotations"]
        assert annotations["summary"].strip()
        assert annotations["description"].strip()
        assert rule["labels"]["severity"] in ("critical", "warning")
        link = RUNBOOK.fullmatch(annotations["runbook_url"])
        assert link is not None, f"{rule['alert']}: runbook_url {annotations['runbook_url']!r}"
        assert link.group(1) in anchors, f"{rule['alert']}: no heading #{link.group(1)}"
        # The runbook names the alert it is for, so a search for the alert's name finds it.
        assert rule["alert"] in alerts_section, rule["alert"]


def test_the_prometheusrule_carries_exactly_the_alerting_rules() -> None:
    resource = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["kind"] == "PrometheusRule"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", resource["metadata"]["name"])
    assert set(resource) == {"apiVersion", "kind", "metadata", "spec"}
    assert resource["spec"] == yaml.safe_load(ALERTS.read_text()), (
        "prometheusrule.yaml's spec differs from codec-proxy-alerts.yaml: copy the alerts file's "
        "`groups:` under `spec:` (indented two spaces)"
    )


# --------------------------------------------------------------------------- promtool


def in_ci() -> bool:
    """Whether this is a CI run (`CI=true`, as GitHub Actions and GitLab set it; .ci/run reads
    it the same way)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def missing_tool(name: str) -> NoReturn:
    """Skip a test whose tool is missing; in CI, fail it: CI must not go green without it."""
    why = f"{name} is not installed: `apt-get install prometheus` enables this test"
    if in_ci():
        pytest.fail(f"{why}. CI=true, so it must run: .ci/run installs it", pytrace=False)
    pytest.skip(why)


def promtool() -> str:
    return shutil.which("promtool") or missing_tool("promtool")


def run_promtool(*args: str, cwd: Path = MONITORING) -> None:
    done = subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def test_promtool_checks_the_rules() -> None:
    run_promtool("check", "rules", ALERTS.name)


def test_promtool_unit_tests_pass() -> None:
    # Each alert has a case where it fires and one where it must not.
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    evaluations = [e for case in cases for e in case.get("alert_rule_test", [])]
    for name in (rule["alert"] for rule in alert_rules()):
        expected = [e["exp_alerts"] for e in evaluations if e["alertname"] == name]
        assert any(expected), f"{name}: no case where it fires"
        assert not all(expected), f"{name}: no case where it stays quiet"
    run_promtool("test", "rules", ALERT_TESTS.name)


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses the expressions of recording rules, so each query becomes one.
    rules = [
        {"record": f"dashboard:query_{index}", "expr": query.evaluable()}
        for index, query in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool("check", "rules", str(path), cwd=tmp_path)


# --------------------------------------------------------------------------- a real Prometheus

SCRAPE_INTERVAL = 1.0
CODEC_FORMATS = ("msgpack", "protobuf")
# Each proxy is one model, so four proxies look like one fleet serving four models.
MODELS = ("smollm2", "drifted", "flaky", "verify")


def prometheus_binary() -> str:
    # PATH first, so that another build can be tried; Debian's package puts it in /usr/bin.
    debian = "/usr/bin/prometheus" if Path("/usr/bin/prometheus").is_file() else None
    return shutil.which("prometheus") or debian or missing_tool("prometheus")


@pytest.mark.parametrize("ci", [None, "false", "true", "TRUE", "1"])
def test_a_missing_tool_skips_only_outside_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str | None
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci in ("true", "TRUE", "1") else pytest.skip.Exception
    with pytest.raises(outcome, match="promtool is not installed") as raised:
        promtool()
    assert ("CI=true, so it must run" in str(raised.value)) == (outcome is pytest.fail.Exception)


def write_prometheus_config(workdir: Path, targets: list[str]) -> Path:
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL:.0f}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL:.0f}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL:.0f}s",
        },
        # The alerting rules are loaded too, so a real Prometheus evaluates them on real series.
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": "codec-proxy", "static_configs": [{"targets": targets}]},
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def open_log(path: Path) -> IO[bytes]:
    # Out here, not in the coroutine: opening a file is blocking I/O.
    return path.open("wb")


@contextlib.asynccontextmanager
async def running_prometheus(workdir: Path, targets: list[str]) -> AsyncIterator[str]:
    """A Prometheus of its own, scraping `targets`; its base URL. Stopped on the way out,
    whatever happened inside."""
    binary = prometheus_binary()
    config = write_prometheus_config(workdir, targets)
    url = f"http://127.0.0.1:{free_port()}"
    log_path = workdir / "prometheus.log"
    with open_log(log_path) as log:
        process = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        try:
            await until_ready(url, process, log_path)
            yield url
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()


async def until_ready(url: str, process: asyncio.subprocess.Process, log: Path) -> None:
    deadline = time.monotonic() + 15
    async with aiohttp.ClientSession() as session:
        while process.returncode is None and time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{url}/-/ready") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    status = process.returncode
    raise AssertionError(f"prometheus did not become ready (exit status {status}); see {log}")


async def api(session: aiohttp.ClientSession, url: str, **params: str) -> Any:
    async with session.get(url, params=params) as resp:
        body = await resp.json()
    assert body["status"] == "success", body
    return body["data"]


async def wait_for_scrapes(session: aiohttp.ClientSession, prometheus: str, after: float) -> None:
    """Until every target has been scraped, and well, since the wall-clock time `after`."""
    deadline = time.monotonic() + 15
    targets: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        targets = (await api(session, f"{prometheus}/api/v1/targets"))["activeTargets"]
        done = [t["health"] == "up" and _timestamp(t["lastScrape"]) > after for t in targets]
        if targets and all(done):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"targets not scraped since {after}: {json.dumps(targets, indent=1)}")


def _timestamp(rfc3339: str) -> float:
    # Prometheus writes nanoseconds; datetime takes at most microseconds.
    trimmed = re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


@pytest.fixture(scope="module")
def gpt2_tokenizer() -> LoadedTokenizer:
    """A tokenizer the SmolLM2 backend does not use: the drifted model's backend answers with it."""
    return load_tokenizer(assets.llamacpp_vocab_dir() / "ggml-vocab-gpt-2.gguf")


async def make_reload_fail(app: web.Application) -> None:
    """Have `app` attempt a configuration reload that is refused, as a SIGHUP with a broken
    config file would (codec_proxy_config_reloads_total{result="error"}): enforcement of a
    safety policy that is not configured."""
    broken = dataclasses.replace(app[LIVE].current.settings, enforce_safety_policy=True)
    result = await reload(app, broken)
    assert not result.ok, result


@dataclasses.dataclass
class Fleet:
    """The proxies under test, one model each, and the fakes behind them."""

    proxies: dict[str, ProxyClient]
    flaky: FakeUpstream

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{client.server.port}" for client in self.proxies.values()]


@pytest.fixture
async def fleet(
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    gpt2_tokenizer: LoadedTokenizer,
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
) -> Fleet:
    async def url_of(app: web.Application) -> str:
        return str((await aiohttp_server(app)).make_url("")).rstrip("/")

    async def proxy(vocabulary: Vocabulary, **settings: Any) -> ProxyClient:
        # ProxyTestServer listens on a real 127.0.0.1 port, which Prometheus scrapes.
        app = create_app(pinned_draws.settings(tokenizer=smollm2_gguf, **settings), vocabulary)
        return await aiohttp_client(app)

    good, flaky, corrupted = FakeUpstream(), FakeUpstream(), FakeUpstream()
    text = corrupted.script.capture.stream_text()
    # The FakeUpstreams replay streams on /tokenize too: their drift checks stay off.
    return Fleet(
        {
            "smollm2": await proxy(
                smollm2_vocabulary,
                upstream=(await url_of(good.app()),),
                model="smollm2",
                drift_check=False,
            ),
            "drifted": await proxy(
                smollm2_vocabulary,
                model="drifted",
                upstream=(await url_of(TokenizingBackend(gpt2_tokenizer).app()),),
            ),
            "flaky": await proxy(
                smollm2_vocabulary,
                upstream=(await url_of(flaky.app()),),
                model="flaky",
                drift_check=False,
            ),
            "verify": await proxy(
                with_swapped_map_ids(smollm2_vocabulary, text),
                model="verify",
                upstream=(await url_of(corrupted.app()),),
                drift_check=False,
                verify_sample_rate=1.0,
            ),
        },
        flaky,
    )


async def post(
    proxy: ProxyClient, body: dict[str, Any], headers: dict[str, str] | None = None
) -> int:
    """One request, read to its end (or to where the connection broke); its status."""
    async with proxy.post("/v1/completions", json=body, headers=headers or {}) as resp:
        with contextlib.suppress(aiohttp.ClientPayloadError):
            await resp.read()
        return resp.status


def codec_body(fmt: str) -> dict[str, Any]:
    return {"prompt": "Hi", "max_tokens": 8, "stream_format": fmt}


JSON_BODY = {"prompt": "Hi", "max_tokens": 8, "stream": True}
BAD_GATEWAY = Capture(
    502, "Bad Gateway", (("Content-Type", "application/json"),), b'{"error": "overloaded"}'
)


async def send_traffic(fleet: Fleet) -> None:
    """One wave of what the dashboard shows: adoption, failures, drift, mismatches, a reload."""
    good = fleet.proxies["smollm2"]
    assert await post(good, JSON_BODY) == 200
    async with good.get("/v1/models") as resp:
        assert resp.status == 200
    for fmt in CODEC_FORMATS:
        for coding in ("identity", "gzip"):
            for version in (None, "0.4"):
                headers = {"Accept-Encoding": coding}
                if version is not None:
                    headers["Codec-Client-Version"] = version
                assert await post(good, codec_body(fmt), headers) == 200, (fmt, coding, version)

    # Drift: Codec is refused with 503, JSON still flows.
    drifted = fleet.proxies["drifted"]
    assert await post(drifted, codec_body("msgpack")) == 503
    assert await post(drifted, JSON_BODY) == 200

    # Upstream failures: a stream cut mid-way (Codec and JSON), a 502, a backend hanging up.
    flaky, sample = fleet.proxies["flaky"], load_capture("llamacpp-completions-sample.txt")
    fleet.flaky.script = Script(sample)
    assert await post(flaky, codec_body("msgpack")) == 200
    fleet.flaky.script = Script(sample, drop_after_events=3)
    assert await post(flaky, codec_body("protobuf")) == 200  # ends with an error frame
    await post(flaky, JSON_BODY)
    fleet.flaky.script = Script(BAD_GATEWAY)
    await post(flaky, codec_body("msgpack"))
    fleet.flaky.script = Script(sample, hang_up=True)
    await post(flaky, codec_body("msgpack"))
    fleet.flaky.script = Script(sample)

    # Verification: every stream checked, against a published map that disagrees.
    for fmt in CODEC_FORMATS:
        assert await post(fleet.proxies["verify"], codec_body(fmt)) == 200

    await make_reload_fail(app_of(fleet.proxies["smollm2"]))


@dataclasses.dataclass(frozen=True)
class ExpectedAlert:
    """What an alert must be after the traffic: its state, and the labels saying whom it is
    about."""

    state: str
    labels: dict[str, str]


def expected_alerts(fleet: Fleet) -> dict[str, ExpectedAlert]:
    """Each alert as send_traffic leaves it. Those without `for:` fire at once; the two with
    `for: 5m` and `for: 10m` can only be pending within the test."""
    return {
        "CodecProxyTokenizerDrift": ExpectedAlert("firing", {"model": "drifted"}),
        "CodecProxyVerificationMismatch": ExpectedAlert("firing", {"model": "verify"}),
        "CodecProxyUpstreamErrors": ExpectedAlert("pending", {"model": "flaky"}),
        "CodecProxyStreamsEndingInError": ExpectedAlert("pending", {"model": "flaky"}),
        "CodecProxyConfigReloadFailed": ExpectedAlert(
            "firing", {"instance": f"127.0.0.1:{fleet.proxies['smollm2'].server.port}"}
        ),
    }


def rule_problems(rules: dict[str, Any], expected: dict[str, ExpectedAlert]) -> list[str]:
    """How Prometheus's evaluation of the alerting rules (/api/v1/rules) differs from
    `expected`: a rule in error, an alert in another state, for other series, or one too many."""
    problems = []
    seen = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["type"] != "alerting":
                continue
            name = rule["name"]
            seen.add(name)
            if rule["health"] == "err":
                problems.append(f"rule {name}: {rule.get('lastError')}")
            want = expected.get(name)
            if want is None:
                problems.append(f"rule {name}: no expected state")
                continue
            got = [
                (alert["state"], {k: alert["labels"].get(k) for k in want.labels})
                for alert in rule["alerts"]
            ]
            if got != [(want.state, want.labels)]:
                problems.append(f"alert {name}: {got or 'inactive'}, not {want}")
    missing = sorted(expected.keys() - seen)
    if missing:
        problems.append(f"rules not loaded: {missing}")
    return problems


async def alert_problems(
    session: aiohttp.ClientSession, prometheus: str, expected: dict[str, ExpectedAlert]
) -> list[str]:
    """rule_problems, once the rules agree or after a few evaluation intervals."""
    deadline = time.monotonic() + 10 * SCRAPE_INTERVAL
    while True:
        problems = rule_problems(await api(session, f"{prometheus}/api/v1/rules"), expected)
        if not problems or time.monotonic() > deadline:
            return problems
        await asyncio.sleep(SCRAPE_INTERVAL / 4)


def series_problems(query: Query, result: list[dict[str, Any]]) -> list[str]:
    """Why `result` would leave the query's panel empty or unlabelled, if it would."""
    shown = query.evaluable().replace("\n", " ")
    if not result:
        return [f"{query.name}: no data\n    {shown}"]
    if all(math.isnan(float(sample["value"][1])) for sample in result):
        return [f"{query.name}: only NaN (nothing observed in the window)\n    {shown}"]
    # What the legend names must be there: an empty one means a label the proxy lacks.
    wanted = LEGEND_LABEL.findall(query.legend)
    missing = sorted({label for s in result for label in wanted if not s["metric"].get(label)})
    if missing:
        return [f"{query.name}: data, but series without label(s) {missing}\n    {shown}"]
    return []


async def test_every_dashboard_query_has_data_from_a_real_prometheus(
    fleet: Fleet, tmp_path: Path
) -> None:
    started = time.monotonic()
    async with asyncio.timeout(55):
        async with (
            running_prometheus(tmp_path, fleet.targets) as prometheus,
            aiohttp.ClientSession() as session,
        ):
            await wait_for_scrapes(session, prometheus, after=0)
            # Two waves a few scrapes apart: a counter's first sample only starts its series,
            # and rate() needs it to have moved since.
            await send_traffic(fleet)
            await asyncio.sleep(3 * SCRAPE_INTERVAL)
            await send_traffic(fleet)
            # Counters move as a response ends, an instant after the client has read it.
            await wait_for_scrapes(session, prometheus, after=time.time() + 0.2)

            problems = []
            for query in dashboard_queries():
                params = {"query": query.evaluable()}
                async with session.get(f"{prometheus}/api/v1/query", params=params) as resp:
                    answer = await resp.json()
                if answer["status"] != "success":
                    problems.append(f"{query.name}: {answer.get('error')}\n    {query.expr}")
                    continue
                problems += series_problems(query, answer["data"]["result"])
            models = await api(
                session,
                f"{prometheus}/api/v1/label/model/values",
                **{"match[]": "codec_proxy_requests_total"},
            )
            if not set(MODELS) <= set(models):
                problems.append(f"variable model: label_values(...) gave {models}, not {MODELS}")
            # The rules are evaluated every interval, an instant behind the scrapes.
            problems += await alert_problems(session, prometheus, expected_alerts(fleet))
    assert not problems, "\n".join(problems)
    assert time.monotonic() - started < 60
