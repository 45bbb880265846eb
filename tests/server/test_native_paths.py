"""Real captures through the proxy on each data path (tests/server/conftest.py `data_path`):
the same IDs and the same relayed bytes either way, and on the native path the steady reads
are the native step's (counted by `codec_proxy_native_reads`), so a silent fall-back fails."""

from __future__ import annotations

import pytest

from proxy.core.steady import NATIVE
from proxy.server.data.drain import LIFECYCLE
from proxy.server.telemetry.metrics import METRICS
from proxy.tokenizers.vocabulary import Vocabulary
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient, app_of
from tests.server.raw_http import Connect
from tests.server.support import frames_of, ids_of, post, wait_for
from tests.server.test_token_ids import captured_ids

# Captures whose every token's IDs render its text (each read after the first is steady).
STEADY = ["vllm-completions-token-ids.txt", "llamacpp-completions-logprobs.txt"]


def proxy_done(proxy: ProxyClient) -> bool:
    """No stream in flight: each has published its accounting."""
    return not app_of(proxy)[LIFECYCLE].streams


def native_reads(proxy: ProxyClient, mode: str) -> float:
    value = app_of(proxy)[METRICS].registry.get_sample_value(
        "codec_proxy_native_reads_total", {"mode": mode}
    )
    return value or 0.0


@pytest.mark.parametrize(
    ("fmt", "coding"),
    [("msgpack", "identity"), ("msgpack-delta", "identity"), ("protobuf", "identity"),
     ("msgpack", "gzip"), ("msgpack-delta", "gzip")],
)  # fmt: skip
@pytest.mark.parametrize("name", STEADY)
async def test_backend_ids_are_the_same_on_each_path(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    data_path: str,
    name: str,
    fmt: str,
    coding: str,
) -> None:
    # One event per write, a little apart: most reads hold one event, as from a backend.
    upstream.script = Script(load_capture(name), delay=0.003)
    proxy = await make_proxy(token_ids="auto")
    body = {"prompt": "x", "max_tokens": 16, "stream_format": fmt}
    # (aiohttp's client undoes the gzip)
    status, headers, raw = await post(
        proxy, "/v1/completions", json=body, headers={"Accept-Encoding": coding}
    )
    assert status == 200
    assert headers["Codec-Token-Source"] == "backend"
    assert headers.get("Content-Encoding", "identity") == coding
    frames = frames_of(raw, fmt)  # type: ignore[arg-type]
    assert ids_of(frames) == captured_ids(name)
    assert sum(frame.done for frame in frames) == 1
    await wait_for(lambda: proxy_done(proxy))  # the stream's accounting is published at its end
    steady = native_reads(proxy, "codec")
    if data_path == "native":
        assert steady >= len(captured_ids(name)) // 2
    else:
        assert steady == 0


@pytest.mark.parametrize("name", [*STEADY, "vllm-chat.txt", "llamacpp-completions-sample.txt"])
async def test_relayed_bytes_are_the_upstreams_on_each_path(
    proxy: ProxyClient, upstream: FakeUpstream, data_path: str, name: str
) -> None:
    capture = load_capture(name)
    upstream.script = Script(capture, delay=0.003)
    status, _, raw = await post(proxy, "/v1/completions", json={"prompt": "x", "stream": True})
    assert status == 200
    assert raw == capture.body
    await wait_for(lambda: proxy_done(proxy))
    steady = native_reads(proxy, "passthrough")
    if data_path == "native":
        assert steady >= len(capture.events) // 2
    else:
        assert steady == 0


def test_the_native_path_is_built_unless_switched_off() -> None:
    # `make test` runs the data-plane tests once more with CODEC_PROXY_NO_EXTENSIONS=1; every
    # other run has the native step, built by `pip install -e .` (proxy/native.py refuses a
    # missing or stale build at import).
    from proxy.core.steady import disabled

    assert (NATIVE is None) == disabled()


@pytest.mark.parametrize("name", STEADY)
async def test_an_http_1_0_client_gets_the_body_unframed_on_each_path(
    proxy: ProxyClient, upstream: FakeUpstream, connect: Connect, data_path: str, name: str
) -> None:
    # No chunked coding for HTTP/1.0 (RFC 9112 §7.1): the body ends with the connection, and
    # the step, which frames chunks, is not armed for it.
    capture = load_capture(name)
    upstream.script = Script(capture, delay=0.003)
    body = b'{"prompt": "x", "stream": true}'
    connection = await connect(proxy)
    await connection.send(
        b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    await connection.until_closed()
    head, _, raw = connection.transcript.partition(b"\r\n\r\n")
    assert head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200"))
    assert b"transfer-encoding" not in head.lower()
    assert raw == capture.body


@pytest.mark.parametrize("coding", ["identity", "gzip"])
async def test_retokenized_ids_are_the_same_on_each_path(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    smollm2_vocabulary: Vocabulary,
    data_path: str,
    coding: str,
) -> None:
    # The step hands each steady read's text to the retokenizer, whose IDs do not depend on
    # how the text was cut: the whole text's, as encoding it at once gives them.
    capture = load_capture("llamacpp-completions-sample.txt")
    upstream.script = Script(capture, delay=0.003)
    proxy = await make_proxy(token_ids="retokenize")
    body = {"prompt": "x", "max_tokens": 16, "stream_format": "msgpack"}
    status, headers, raw = await post(
        proxy, "/v1/completions", json=body, headers={"Accept-Encoding": coding}
    )
    assert status == 200
    assert headers["Codec-Token-Source"] == "retokenized"
    expected = smollm2_vocabulary.scheme.encode_exactly(capture.stream_text(), at_start=True)
    assert ids_of(frames_of(raw, "msgpack")) == expected
    await wait_for(lambda: proxy_done(proxy))
    steady = native_reads(proxy, "codec")
    if data_path == "native":
        assert steady >= len(capture.events) // 2
    else:
        assert steady == 0
