"""An upstream that cuts UTF-16 surrogate pairs between events, served in-process.

Some servers cut a character outside the BMP between two events, each half a lone JSON escape
(`"... \\ud83c"` then `"\\udf89 ..."`). The proxy rejoins such a pair; a surrogate nothing can
rejoin ends a Codec stream with exactly one terminal error frame, whether the upstream's body
is read at once or frames are already out, and the access log says so. A policed JSON stream
neither drops those events nor sends them unchecked.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import aiohttp
import pytest

from proxy.core.stream.token_source import RetokenizedIds
from proxy.tokenizers import LoadedTokenizer
from tests.codec_client import codecai_frames, codecai_map, render
from tests.fake_upstream import Capture, FakeUpstream, Script
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.policy_support import v04, write_policy
from tests.server.support import access_line, frames_of

CODEC = {"prompt": "Once", "max_tokens": 32, "stream_format": "msgpack"}
JSON = {"prompt": "Once", "max_tokens": 32, "stream": True}
# Enough text before the cut that frames are out when it arrives.
BEFORE = ["Once upon a time, ", "there was a ", "party "]


def event(text: str, finish: str | None = None) -> bytes:
    # json.dumps writes a lone surrogate as the `\ud83c` escape such a server sends.
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


def stream(*texts: str) -> bytes:
    return b"".join(event(t) for t in texts) + event("", "length") + b"data: [DONE]\n\n"


def script(body: bytes, *, at_once: bool) -> Script:
    if at_once:
        # One write: the proxy reads the whole stream before the response starts.
        comment = Capture(200, "OK", (("Content-Type", "text/event-stream"),), b": end\n\n")
        return Script(comment, inject_after_events=0, inject=body)
    capture = Capture(200, "OK", (("Content-Type", "text/event-stream"),), body)
    return Script(capture, delay=0.02)


@pytest.mark.parametrize("at_once", [True, False], ids=["read-at-once", "frames-out"])
async def test_a_pair_cut_between_events_is_rejoined(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    caplog: pytest.LogCaptureFixture,
    at_once: bool,
) -> None:
    upstream.script = script(stream(*BEFORE, "\ud83c", "\udf89 and cake"), at_once=at_once)
    caplog.set_level(logging.INFO, logger="codec_proxy")
    async with proxy.post("/v1/completions", json=CODEC) as resp:
        assert resp.status == 200
        raw = await resp.read()
    frames = await codecai_frames(raw, "msgpack")
    assert render(codecai_map(smollm2_tokenizer), frames) == "".join(BEFORE) + "🎉 and cake"
    assert frames_of(raw, "msgpack")[-1].finish_reason == "length"
    assert (await access_line(caplog))["outcome"] == "ok"


@pytest.mark.parametrize("at_once", [True, False], ids=["read-at-once", "frames-out"])
@pytest.mark.parametrize(
    "texts",
    [
        (*BEFORE, "\udf89 and cake"),  # a low half alone
        (*BEFORE, "\ud83c", " and cake"),  # a high half the next text does not complete
        (*BEFORE, "\ud83c"),  # the stream ends on a high half
    ],
    ids=["low-half", "unpaired-high", "high-at-the-end"],
)
async def test_a_lone_surrogate_ends_the_codec_stream_with_one_error_frame(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    smollm2_tokenizer: LoadedTokenizer,
    caplog: pytest.LogCaptureFixture,
    at_once: bool,
    texts: tuple[str, ...],
) -> None:
    upstream.script = script(stream(*texts), at_once=at_once)
    caplog.set_level(logging.INFO, logger="codec_proxy")
    async with proxy.post("/v1/completions", json=CODEC) as resp:
        assert resp.status == 200
        raw = await resp.read()
    frames = frames_of(raw, "msgpack")  # exactly one terminal frame, the last
    assert (tuple(frames[-1].ids), frames[-1].finish_reason) == ((), "error")
    if not at_once:
        assert len(frames) > 2  # frames had gone out before the bad event came
    # The text before the bad character reached the client.
    shown = render(codecai_map(smollm2_tokenizer), await codecai_frames(raw, "msgpack"))
    assert shown == "".join(BEFORE)
    assert (await access_line(caplog))["outcome"] == "upstream_error"
    assert any(
        r.levelno >= logging.WARNING and "surrogate" in r.getMessage() for r in caplog.records
    )


@pytest.fixture
async def policed(make_proxy: MakeProxy, tmp_path: Path) -> ProxyClient:
    return await make_proxy(safety_policy=write_policy(tmp_path))


def sse_text(raw: bytes) -> str:
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])


@pytest.mark.parametrize("at_once", [True, False], ids=["read-at-once", "frames-out"])
async def test_a_policed_json_stream_rejoins_the_pair(
    policed: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture, at_once: bool
) -> None:
    upstream.script = script(stream(*BEFORE, "\ud83c", "\udf89 and cake"), at_once=at_once)
    caplog.set_level(logging.INFO, logger="codec_proxy")
    async with policed.post("/v1/completions", json=JSON, headers=v04()) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert sse_text(raw) == "".join(BEFORE) + "🎉 and cake"
    assert (await access_line(caplog))["outcome"] == "ok"
    assert not any("dropped" in r.getMessage() for r in caplog.records)


async def test_a_lone_surrogate_in_a_policed_json_stream_is_an_upstream_failure(
    policed: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    # Text that cannot be checked is not sent, and the events are not dropped in silence:
    # the body is cut (a truncated JSON body must not look whole) and logged as a failure.
    upstream.script = script(stream(*BEFORE, "\udf89 and cake"), at_once=False)
    caplog.set_level(logging.INFO, logger="codec_proxy")
    async with policed.post("/v1/completions", json=JSON, headers=v04()) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    assert (await access_line(caplog))["outcome"] == "upstream_failed: UpstreamProtocolError"


async def test_read_at_once_it_is_a_clean_502(
    policed: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    upstream.script = script(stream(*BEFORE, "\udf89 and cake"), at_once=True)
    caplog.set_level(logging.INFO, logger="codec_proxy")
    async with policed.post("/v1/completions", json=JSON, headers=v04()) as resp:
        assert resp.status == 502
        error = (await resp.json())["error"]
    assert error["code"] == "bad_upstream_chunk"
    assert (await access_line(caplog))["status"] == 502
    assert any(
        r.levelno >= logging.WARNING and "surrogate" in r.getMessage() for r in caplog.records
    )


async def test_a_fault_of_ours_mid_stream_ends_with_one_error_frame_and_is_logged(
    proxy: ProxyClient,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = RetokenizedIds.take
    calls = 0

    def take(self: RetokenizedIds) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("a bug")
        return real(self)

    monkeypatch.setattr(RetokenizedIds, "take", take)
    upstream.script = script(stream(*BEFORE, "and cake"), at_once=False)
    caplog.set_level(logging.INFO, logger="codec_proxy")
    async with proxy.post("/v1/completions", json=CODEC) as resp:
        assert resp.status == 200
        raw = await resp.read()
    frames = frames_of(raw, "msgpack")
    assert len(frames) > 1  # frames were out before it
    assert (tuple(frames[-1].ids), frames[-1].finish_reason) == ((), "error")
    assert (await access_line(caplog))["outcome"] == "internal_error"
    assert any(
        r.levelno == logging.ERROR and "RuntimeError: a bug" in r.getMessage()
        for r in caplog.records
    )
