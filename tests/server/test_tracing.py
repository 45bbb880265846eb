"""OpenTelemetry traces, as a collector receives them: the span tree of each kind of request.

The proxy exports to an OTLP/HTTP receiver in this process (tests/otlp_receiver.py), which
decodes what arrives with the official protobuf classes; the fake upstream records the
`traceparent` each upstream attempt carried.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from proxy.cli import build_parser, check_config
from proxy.core.backend.readiness import Check
from proxy.core.errors import ConfigError
from proxy.core.wire.decoder import FrameDecoder
from proxy.server.control.admin import ADMIN_APP
from proxy.server.control.local import PROBE_PATHS
from proxy.server.data.client_protocol import HALF_CLOSE_GRACE
from proxy.trace_endpoint import TraceEndpoint, trace_endpoint
from tests import pinned_draws
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.server.conftest import (
    AiohttpClient,
    AiohttpServer,
    MakeProxy,
    ProxyClient,
    app_of,
    default_model,
)
from tests.server.support import frames_of, post

SAMPLE = "llamacpp-completions-sample.txt"
CODEC = {"model": "smollm2", "prompt": "Hi", "max_tokens": 32, "stream_format": "msgpack"}
JSON = {"model": "smollm2", "prompt": "Hi", "max_tokens": 32, "stream": True}
CHAT = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "Hi"}],
    "stream_format": "msgpack",
}
PATH_B = msgpack.packb({"prompt_ids": [504, 3575, 282], "max_tokens": 8})
# The caller's trace: the proxy's server span is its child.
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
CALLER = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": "vendor=opaque"}


@pytest.fixture(autouse=True)
def batches_every_20_ms(otel_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans leave the batch processor within 20 ms (no other OTEL_* variable is set:
    tests/conftest.py)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")


@pytest.fixture
async def receiver(aiohttp_server: AiohttpServer) -> tuple[OtlpReceiver, str]:
    otlp = OtlpReceiver()
    server = await aiohttp_server(otlp.app())
    return otlp, str(server.make_url("/v1/traces"))


@pytest.fixture
async def traced(make_proxy: MakeProxy, receiver: tuple[OtlpReceiver, str]) -> ProxyClient:
    return await make_proxy(otlp_traces_endpoint=receiver[1])


def one(spans: list[ReceivedSpan], kind: str) -> ReceivedSpan:
    [span] = [s for s in spans if s.kind == kind]
    return span


def upstream_traceparent(upstream: FakeUpstream, index: int = -1) -> str:
    headers = {k.lower(): v for k, v in upstream.requests[index].headers.items()}
    return headers["traceparent"]


def traceparent_of(span: ReceivedSpan) -> str:
    """`span`'s context as `traceparent` carries it (sampled: it was exported), with the
    trace flags the SDK sets beside (Level 2's `random`) left out."""
    return f"00-{span.trace_id}-{span.span_id}-01"


def sampled(traceparent: str) -> str:
    *fields, flags = traceparent.split("-")
    return "-".join([*fields, f"{int(flags, 16) & 1:02x}"])


def assert_tree(spans: list[ReceivedSpan], upstream: FakeUpstream) -> tuple[ReceivedSpan, ...]:
    """One server span under the caller's, one client span under it, whose context is the
    one the upstream received."""
    server, client = one(spans, "server"), one(spans, "client")
    assert {s.trace_id for s in spans} == {CALLER_TRACE}
    assert server.parent_id == CALLER_SPAN
    assert client.parent_id == server.span_id
    assert sampled(upstream_traceparent(upstream)) == traceparent_of(client)
    # The caller's tracestate travels with the trace, and its traceparent never as it was.
    raw = [(k.lower(), v) for k, v in upstream.requests[-1].raw_headers]
    assert [v for k, v in raw if k == b"tracestate"] == [b"vendor=opaque"]
    assert len([v for k, v in raw if k == b"traceparent"]) == 1
    assert server.start <= client.start <= client.end <= server.end
    assert server.resource["service.name"] == "codec-proxy"
    return server, client


# --- when traces are on, and where they go ----------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "environ", "endpoint"),
    [
        (None, {}, None),
        ("http://collector:4318", {}, "http://collector:4318/v1/traces"),
        ("http://collector:4318/", {}, "http://collector:4318/v1/traces"),
        ("https://otlp.example/custom/path", {}, "https://otlp.example/custom/path"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        (
            None,
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/in",
            },
            "http://t:4318/in",
        ),
        # The setting wins over the variables, as a flag does.
        ("http://s:4318", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/in"}, "http://s:4318/v1/traces"),
        ("http://s:4318", {"OTEL_SDK_DISABLED": "true"}, None),
        ("http://s:4318", {"OTEL_TRACES_EXPORTER": "none"}, None),
        ("http://s:4318", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http://s:4318/v1/traces"),
    ],
)  # fmt: skip
def test_traces_are_on_only_with_an_endpoint(
    configured: str | None, environ: dict[str, str], endpoint: str | None
) -> None:
    config = trace_endpoint(configured, environ)
    assert config == (None if endpoint is None else TraceEndpoint(endpoint))


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTLP/HTTP only"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTLP/HTTP only"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "only 'otlp' or 'none'"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4317"}, "not an http(s) URL"),
    ],
)
def test_what_the_proxy_cannot_export_fails_at_start(environ: dict[str, str], message: str) -> None:
    configured = None if "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in environ else "http://c:4318"
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        trace_endpoint(configured, environ)


def test_the_check_before_start_refuses_what_the_proxy_cannot_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once, before any worker starts: a worker failing on it would only be restarted."""
    file = tmp_path / "c.toml"
    file.write_text(
        f'upstream = "http://x"\ntokenizer = "{tmp_path}"\n'
        'otlp_traces_endpoint = "http://collector:4318"\n'
    )
    args = build_parser().parse_args(["check-config", str(file)])
    assert check_config(args) == 0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert check_config(args) == 2
    assert "traces are exported over OTLP/HTTP only" in capsys.readouterr().err


def test_off_nothing_of_opentelemetry_is_imported(smollm2_gguf: Path) -> None:
    """A proxy without an endpoint serves a streamed request and never imports the SDK."""
    program = f"""
import asyncio, sys
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from proxy.server import create_app
from proxy.server.process.runner import ProxyRunner
from proxy.settings import Settings

class ProxyServer(TestServer):
    async def _make_runner(self, **kwargs):
        return ProxyRunner(self.app, **kwargs)

async def upstream(request):
    response = web.StreamResponse(headers={{"Content-Type": "text/event-stream"}})
    await response.prepare(request)
    event = b'data: {{"choices": [{{"text": "x", "index": 0}}]}}\\n\\n'
    await response.write(event + b"data: [DONE]\\n\\n")
    return response

async def main():
    backend = web.Application()
    backend.router.add_route("*", "/{{tail:.*}}", upstream)
    async with TestServer(backend) as server:
        url = str(server.make_url("")).rstrip("/")
        settings = Settings(
            upstream=(url,), tokenizer={str(smollm2_gguf)!r}, drift_check=False,
            **{pinned_draws.PINNED!r},
        )
        async with TestClient(ProxyServer(create_app(settings))) as client:
            json_body = {{"prompt": "Hi", "stream": True}}
            for body in (json_body, {{"prompt": "Hi", "stream_format": "msgpack"}}):
                async with client.post("/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
    loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
    assert loaded == [], loaded
    print("ok")

asyncio.run(main())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


async def test_off_the_callers_trace_context_passes_through_as_sent(
    proxy: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with proxy.post("/v1/completions", json=CODEC, headers=CALLER) as resp:
        assert resp.status == 200
        assert "traceresponse" not in resp.headers
        await resp.read()
    assert upstream_traceparent(upstream) == CALLER["traceparent"]
    [line] = [r.fields for r in caplog.records if hasattr(r, "fields")]
    assert line["trace_id"] is None


async def test_off_an_untrusted_callers_trace_context_is_not_sent_upstream(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(trust_trace_context=False)
    for body in (CODEC, JSON):
        status, _, _ = await post(proxy, "/v1/completions", json=body, headers=CALLER)
        assert status == 200
    assert len(upstream.requests) == 2
    for request in upstream.requests:
        sent = {name.lower() for name, _ in request.raw_headers}
        assert sent.isdisjoint({b"traceparent", b"tracestate"})
        assert b"x-request-id" in sent  # the other end-to-end fields still go


# --- callers not trusted with trace context (internet-facing) ---------------------------------


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
async def test_under_a_zero_ratio_only_a_trusted_callers_flag_samples(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    receiver: tuple[OtlpReceiver, str],
    monkeypatch: pytest.MonkeyPatch,
    trusted: bool,
) -> None:
    """`parentbased_traceidratio` at 0: a trusted caller's sampled `traceparent` still has
    every one of its requests exported; an untrusted caller's decides nothing."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    proxy = await make_proxy(otlp_traces_endpoint=receiver[1], trust_trace_context=trusted)
    for _ in range(10):
        status, headers, _ = await post(proxy, "/v1/completions", json=CODEC, headers=CALLER)
        assert status == 200
        assert sampled(headers["traceresponse"]).endswith("-01" if trusted else "-00")
    await proxy.close()  # the provider's shutdown exports whatever it still holds
    assert len(receiver[0].spans) == (20 if trusted else 0)


async def test_an_untrusted_callers_trace_is_only_linked(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    receiver: tuple[OtlpReceiver, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A caller that names another's trace gets a trace of its own: the one it named holds none
    of the proxy's spans, and the backend gets no trace context of the caller's."""
    caplog.set_level(logging.INFO)
    proxy = await make_proxy(otlp_traces_endpoint=receiver[1], trust_trace_context=False)
    traceresponses = []
    for _ in range(2):
        status, headers, _ = await post(proxy, "/v1/completions", json=CODEC, headers=CALLER)
        assert status == 200
        traceresponses.append(sampled(headers["traceresponse"]))
    spans = await receiver[0].wait_for(4)
    servers = sorted((s for s in spans if s.kind == "server"), key=lambda s: s.start)
    assert CALLER_TRACE not in {s.trace_id for s in spans}
    assert len({s.trace_id for s in servers}) == 2  # one new trace per request
    for server in servers:
        assert server.parent_id == ""
        assert server.links == ((CALLER_TRACE, CALLER_SPAN),)
        [client] = [s for s in spans if s.parent_id == server.span_id]
        assert (client.trace_id, client.kind, client.links) == (server.trace_id, "client", ())
    # The responses, the access log lines and the upstream requests name the proxy's traces.
    assert traceresponses == [traceparent_of(s) for s in servers]
    lines = [r.fields for r in caplog.records if hasattr(r, "fields")]
    assert [line["trace_id"] for line in lines] == [s.trace_id for s in servers]
    [client] = [s for s in spans if s.parent_id == servers[-1].span_id]
    assert sampled(upstream_traceparent(upstream)) == traceparent_of(client)
    raw = [(k.lower(), v) for k, v in upstream.requests[-1].raw_headers]
    assert [k for k, _ in raw if k in (b"traceparent", b"tracestate")] == [b"traceparent"]


# --- the span tree of each kind of request ----------------------------------------------------


async def test_a_relayed_json_stream(
    traced: ProxyClient,
    upstream: FakeUpstream,
    receiver: tuple[OtlpReceiver, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with traced.post("/v1/completions", json=JSON, headers=CALLER) as resp:
        assert resp.status == 200
        body = await resp.read()
        traceresponse = resp.headers["traceresponse"]
    assert body == load_capture(SAMPLE).body
    server, client = assert_tree(await receiver[0].wait_for(2), upstream)
    # The caller finds the trace: in the response, and in the access log.
    assert sampled(traceresponse) == traceparent_of(server)
    [line] = [r.fields for r in caplog.records if hasattr(r, "fields")]
    assert line["trace_id"] == CALLER_TRACE
    assert server.name == "POST /v1/completions"
    assert server.status == "unset"
    attributes = server.attributes
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/completions"
    assert attributes["url.path"] == "/v1/completions"
    assert attributes["http.response.status_code"] == 200
    assert attributes["gen_ai.operation.name"] == "text_completion"
    assert attributes["gen_ai.request.model"] == "smollm2"
    assert attributes["codec.mode"] == "passthrough"
    assert attributes["codec.outcome"] == "ok"
    assert attributes["codec.request_id"] == line["id"]  # the proxy's own: none was sent
    assert attributes["codec.bytes_sent"] == attributes["codec.upstream_bytes"] == len(body)
    assert 0 < attributes["gen_ai.response.time_to_first_chunk"] < 5
    # Relayed bytes are not read: nothing said about tokens or finish reasons.
    assert "gen_ai.usage.output_tokens" not in attributes
    assert "codec.stream_format" not in attributes
    assert client.name == "text_completion smollm2"
    host, port = upstream_address(upstream)
    assert client.attributes == {
        "http.request.method": "POST",
        "server.address": host,
        "server.port": port,
        "url.full": f"http://{host}:{port}/v1/completions",
        "gen_ai.operation.name": "text_completion",
        "gen_ai.request.model": "smollm2",
        "http.response.status_code": 200,
    }


def upstream_address(upstream: FakeUpstream) -> tuple[str, int]:
    host = upstream.requests[-1].headers["Host"]
    name, _, port = host.rpartition(":")
    return name, int(port)


async def test_a_codec_stream_ends_its_span_after_its_terminal_frame(
    traced: ProxyClient, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    capture = load_capture(SAMPLE)
    release = asyncio.Event()
    # The upstream holds its finish chunk back until the test lets it go.
    upstream.script = Script(capture, stall_after_events=32, stall_until=release)
    decoder = FrameDecoder("msgpack")
    frames = []
    async with traced.post("/v1/completions", json=CODEC, headers=CALLER) as resp:
        assert resp.status == 200
        coding = resp.headers["Content-Encoding"]  # aiohttp's client accepts gzip
        frames += decoder.feed(await resp.content.readany())
        first_frame_at = time.time_ns()
        assert frames
        assert not any(frame.done for frame in frames)
        await asyncio.sleep(0.2)
        released_at = time.time_ns()
        release.set()
        raw = await resp.read()
        terminal_at = time.time_ns()
    frames += decoder.feed(raw)
    assert [frame.done for frame in frames].index(True) == len(frames) - 1
    server, client = assert_tree(await receiver[0].wait_for(2), upstream)
    # Not the first byte: the span lasts until the terminal frame could be, and was, sent.
    assert server.end > released_at >= first_frame_at + 200_000_000
    assert server.end - terminal_at < 50_000_000
    assert client.end > released_at
    attributes = server.attributes
    tokens = sum(len(frame.ids) for frame in frames)
    assert attributes["codec.mode"] == "codec"
    assert attributes["codec.stream_format"] == "msgpack"
    assert attributes["codec.content_coding"] == coding == "gzip"
    assert attributes["codec.token_source"] == "retokenized"
    assert attributes["codec.tokens"] == tokens
    # The backend's own count (its usage), not the IDs sent.
    assert (attributes["gen_ai.usage.output_tokens"], attributes["gen_ai.usage.input_tokens"]) == (
        32,
        4,
    )
    assert attributes["gen_ai.response.finish_reasons"] == (frames[-1].finish_reason,)
    # What the upstream's finishing chunk says generated the answer.
    assert attributes["gen_ai.response.model"] == "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    # The client's frames against the JSON the upstream sent.
    assert 0 < attributes["codec.bytes_sent"] < attributes["codec.upstream_bytes"]
    assert attributes["codec.upstream_bytes"] == len(capture.body)
    assert "codec.verification" not in attributes  # not sampled: the tests sample none
    assert server.status == "unset"


async def test_a_sampled_codec_stream_names_its_verdict_and_usage(
    make_proxy: MakeProxy, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    upstream.script = Script(load_capture("vllm-completions-token-ids.txt"))
    proxy = await make_proxy(otlp_traces_endpoint=receiver[1], verify_sample_rate=1.0)
    default_model(proxy).verification.prepare()
    await asyncio.sleep(0.5)  # the map's decoder is built off the loop
    status, _, raw = await post(proxy, "/v1/completions", json=CODEC, headers=CALLER)
    assert status == 200
    frames = frames_of(raw, "msgpack")
    server = one(await receiver[0].wait_for(2), "server")
    attributes = server.attributes
    assert attributes["codec.verification"] == "match"
    assert attributes["codec.token_source"] == "backend"
    # vLLM's usage chunk comes after the finish chunk, which ends the frames: the IDs sent.
    assert attributes["gen_ai.usage.output_tokens"] == sum(len(f.ids) for f in frames)


async def test_path_b(
    traced: ProxyClient, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    headers = {"Content-Type": "application/x-msgpack", **CALLER}
    status, response_headers, raw = await post(
        traced, "/v1/completions/codec", data=PATH_B, headers=headers
    )
    assert status == 200
    assert frames_of(raw, "msgpack")[-1].done
    spans = await receiver[0].wait_for(2)
    server, client = assert_tree(spans, upstream)
    assert sampled(response_headers["traceresponse"]) == traceparent_of(server)
    assert server.name == "POST /v1/completions/codec"
    assert server.attributes["gen_ai.operation.name"] == "text_completion"
    assert server.attributes["codec.mode"] == "codec"
    # A CodecRequest names no model; the upstream request asks the completions route.
    assert "gen_ai.request.model" not in server.attributes
    assert client.name == "text_completion"
    assert client.attributes["url.full"].endswith("/v1/completions")


async def test_chat(
    traced: ProxyClient, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    upstream.script = Script(load_capture("llamacpp-chat-sample.txt"))
    headers = {**CALLER, "X-Request-Id": "chat-7"}
    status, _, raw = await post(traced, "/v1/chat/completions", json=CHAT, headers=headers)
    assert status == 200
    frames = frames_of(raw, "msgpack")
    server, client = assert_tree(await receiver[0].wait_for(2), upstream)
    assert server.name == "POST /v1/chat/completions"
    assert server.attributes["gen_ai.operation.name"] == "chat"
    # The id the client got back, which a user who saw a failure has.
    assert server.attributes["codec.request_id"] == "chat-7"
    assert server.attributes["gen_ai.response.finish_reasons"] == (frames[-1].finish_reason,)
    assert client.name == "chat smollm2"
    assert client.attributes["url.full"].endswith("/v1/chat/completions")


async def test_a_retry_before_the_first_byte_is_a_span_of_its_own(
    traced: ProxyClient, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    # The second request finds the kept-alive connection closed by the upstream: sent again.
    upstream.script = Script(load_capture(SAMPLE), hang_up_on_reused_connection=True)
    for _ in range(2):
        status, _, _ = await post(traced, "/v1/completions", json=CODEC, headers=CALLER)
        assert status == 200
    spans = await receiver[0].wait_for(5)
    assert len(spans) == 5
    first_server = next(s for s in spans if s.kind == "server")
    second = [s for s in spans if s.start > first_server.end]
    server = one(second, "server")
    failed, sent = sorted((s for s in second if s.kind == "client"), key=lambda s: s.start)
    assert failed.parent_id == sent.parent_id == server.span_id
    assert failed.status == "error"
    assert failed.attributes["error.type"] == "Disconnected"
    assert "http.request.resend_count" not in failed.attributes
    assert "http.response.status_code" not in failed.attributes
    assert sent.attributes["http.request.resend_count"] == 1
    assert sent.attributes["http.response.status_code"] == 200
    assert failed.end <= sent.start
    # Each attempt went up with its own span's context.
    assert upstream.outcomes[-2:] == ["hung_up", "complete"]
    assert sampled(upstream_traceparent(upstream, -2)) == traceparent_of(failed)
    assert sampled(upstream_traceparent(upstream, -1)) == traceparent_of(sent)
    assert server.status == "unset"  # the request itself succeeded


async def test_a_client_that_leaves_mid_stream(
    traced: ProxyClient, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    never = asyncio.Event()
    upstream.script = Script(load_capture(SAMPLE), stall_after_events=10, stall_until=never)
    async with traced.post("/v1/completions", json=CODEC, headers=CALLER) as resp:
        assert resp.status == 200
        assert await resp.content.readany()
        await asyncio.sleep(HALF_CLOSE_GRACE)  # sooner, its EOF would be a half-close
        resp.close()
    server, client = assert_tree(await receiver[0].wait_for(2), upstream)
    assert server.attributes["codec.outcome"] == "client_disconnect"
    assert server.attributes["http.response.status_code"] == 499  # as the access log says
    assert server.status == "unset"  # the client's doing, not a failure
    assert 0 < server.attributes["codec.upstream_bytes"] < len(load_capture(SAMPLE).body)
    assert client.status == "unset"
    never.set()


async def test_a_refused_codec_request_is_a_span_without_an_upstream(
    make_proxy: MakeProxy, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    proxy = await make_proxy(otlp_traces_endpoint=receiver[1], codec_enabled=False)
    status, headers, _ = await post(proxy, "/v1/completions", json=CODEC, headers=CALLER)
    assert status == 403
    [server] = await receiver[0].wait_for(1)
    assert sampled(headers["traceresponse"]) == traceparent_of(server)
    assert (server.kind, server.parent_id) == ("server", CALLER_SPAN)
    assert server.attributes["codec.refusal"] == "codec_not_enabled"
    assert server.attributes["codec.error_code"] == "codec_not_enabled"
    assert server.attributes["http.response.status_code"] == 403
    assert server.status == "unset"  # a 4xx is the client's (the HTTP conventions)
    assert "error.type" not in server.attributes
    assert upstream.requests == []


async def test_a_codec_request_refused_with_503_is_an_error(
    traced: ProxyClient, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    default_model(traced).readiness.update(
        Check("drift", ready=True, reason="tokenizer_mismatch", refuses_codec=True)
    )
    status, _, _ = await post(traced, "/v1/completions", json=CODEC, headers=CALLER)
    assert status == 503
    [server] = await receiver[0].wait_for(1)
    assert server.attributes["codec.refusal"] == "tokenizer_mismatch"
    assert server.attributes["error.type"] == "tokenizer_mismatch"
    assert server.attributes["http.response.status_code"] == 503
    assert server.status == "error"
    assert upstream.requests == []


async def test_an_unsampled_caller_is_not_exported_and_its_decision_travels(
    traced: ProxyClient, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    unsampled = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"}
    async with traced.post("/v1/completions", json=CODEC, headers=unsampled) as resp:
        assert resp.headers["traceresponse"].startswith(f"00-{CALLER_TRACE}-")
        assert resp.headers["traceresponse"].endswith("-00")
        await resp.read()
    sent = upstream_traceparent(upstream)
    assert sent.startswith(f"00-{CALLER_TRACE}-")
    assert sent.endswith("-00")
    assert sent != unsampled["traceparent"]
    # A sampled request after it: only its spans arrive.
    await post(traced, "/v1/completions", json=CODEC, headers=CALLER)
    spans = await receiver[0].wait_for(2)
    await asyncio.sleep(0.1)
    assert len(receiver[0].spans) == 2
    assert sampled(upstream_traceparent(upstream)) == traceparent_of(one(spans, "client"))


async def test_probes_are_not_traced_and_a_request_without_a_caller_starts_a_trace(
    traced: ProxyClient, upstream: FakeUpstream, receiver: tuple[OtlpReceiver, str]
) -> None:
    for path in ("/livez", "/readyz", "/metrics"):
        async with traced.get(path) as resp:
            assert resp.status == 200
            assert "traceresponse" not in resp.headers
    async with traced.get("/codec/schema") as resp:
        assert resp.status == 200
    status, _, _ = await post(traced, "/v1/completions", json=CODEC)
    assert status == 200
    spans = await receiver[0].wait_for(3)
    assert [s.name for s in spans if s.kind == "server"] == [
        "GET /codec/schema",
        "POST /v1/completions",
    ]
    server, client = one(spans[1:], "server"), one(spans, "client")
    assert server.parent_id == ""
    assert client.trace_id == server.trace_id
    assert sampled(upstream_traceparent(upstream)) == traceparent_of(client)


async def test_the_proxy_exports_what_is_left_when_it_stops(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    receiver: tuple[OtlpReceiver, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    proxy = await make_proxy(otlp_traces_endpoint=receiver[1])
    status, _, _ = await post(proxy, "/v1/completions", json=CODEC)
    assert status == 200
    await asyncio.sleep(0.2)
    assert receiver[0].spans == []  # held by the batch processor, whose schedule is 10 min
    await proxy.close()  # the app's cleanup: the provider is shut down, its spans flushed
    assert {s.kind for s in receiver[0].spans} == {"server", "client"}


async def test_with_an_admin_port_neither_port_traces_the_probes(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    receiver: tuple[OtlpReceiver, str],
    aiohttp_client: AiohttpClient,
) -> None:
    # Any admin port: test servers listen where they choose.
    serving = await make_proxy(otlp_traces_endpoint=receiver[1], admin_port=1)
    admin = await aiohttp_client(app_of(serving)[ADMIN_APP])
    for path in PROBE_PATHS:
        for client in (serving, admin):  # relayed to the backend's, answered by the proxy
            async with client.get(path) as resp:
                assert "traceresponse" not in resp.headers
                await resp.read()
    assert {r.path_qs for r in upstream.requests} >= set(PROBE_PATHS)
    status, _, _ = await post(serving, "/v1/completions", json=CODEC)
    assert status == 200
    spans = await receiver[0].wait_for(2)
    await asyncio.sleep(0.1)
    assert sorted(s.name for s in receiver[0].spans) == [
        "POST /v1/completions",
        "text_completion smollm2",
    ]
    assert one(spans, "server").attributes["http.route"] == "/v1/completions"
