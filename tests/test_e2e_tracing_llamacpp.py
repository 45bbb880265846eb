"""End to end: the trace of a Codec request through the real llama.cpp server, as a collector
decodes it (an OTLP/HTTP receiver in this process). Run with `-s` to see it printed."""

from __future__ import annotations

import pytest

from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.otlp_receiver import OtlpReceiver, render_trace
from tests.server.conftest import AiohttpClient, AiohttpServer
from tests.server.support import frames_of, post

pytestmark = pytest.mark.backend

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


async def test_a_codec_request_through_llama_cpp(
    llama_server: str,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No other OTEL_* variable is set (tests/conftest.py).
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    receiver = OtlpReceiver()
    collector = await aiohttp_server(receiver.app())
    settings = pinned_draws.settings(
        upstream=(llama_server,),
        tokenizer=smollm2_vocabulary.loaded.source,
        otlp_traces_endpoint=str(collector.make_url("/")),  # the collector's base URL
    )
    proxy = await aiohttp_client(create_app(settings, smollm2_vocabulary))
    body = {
        "model": "smollm2",
        "prompt": "The capital of France is",
        "max_tokens": 16,
        "temperature": 0,
        "seed": 7,
        "stream_format": "msgpack",
    }
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "Accept-Encoding": "identity"}
    status, response_headers, raw = await post(proxy, "/v1/completions", json=body, headers=headers)
    assert status == 200
    frames = frames_of(raw, "msgpack")
    spans = await receiver.wait_for(2)
    print("\n" + render_trace(spans))
    [server] = [s for s in spans if s.kind == "server"]
    [client] = [s for s in spans if s.kind == "client"]
    assert (server.trace_id, server.parent_id) == (CALLER_TRACE, CALLER_SPAN)
    assert (client.trace_id, client.parent_id) == (CALLER_TRACE, server.span_id)
    assert response_headers["traceresponse"].startswith(f"00-{CALLER_TRACE}-{server.span_id}-")
    attributes = server.attributes
    assert attributes["codec.token_source"] == response_headers["Codec-Token-Source"] == "backend"
    assert attributes["gen_ai.response.finish_reasons"] == (frames[-1].finish_reason,)
    assert attributes["gen_ai.response.model"].endswith(".gguf")  # llama.cpp names its file
    # llama.cpp's usage: 16 tokens asked for, and the IDs sent are the ones it sampled.
    assert attributes["gen_ai.usage.output_tokens"] == 16
    assert attributes["codec.tokens"] == sum(len(frame.ids) for frame in frames) == 16
    assert 0 < attributes["codec.bytes_sent"] < attributes["codec.upstream_bytes"]
    assert client.attributes["server.address"] == "127.0.0.1"
    assert client.attributes["http.response.status_code"] == 200
    assert server.start <= client.start <= client.end <= server.end
