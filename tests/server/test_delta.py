"""`stream_format: "msgpack-delta"` (spec v0.5, codec-spec.md §1.5) and the `protobuf-delta`
fall-back to plain protobuf, said in `Codec-Stream-Format`."""

from __future__ import annotations

import msgpack
import pytest

from tests.codec_client import codecai_frames
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import ProxyClient
from tests.server.support import frames_of, ids_of, post


def body(fmt: str) -> dict[str, object]:
    return {"prompt": "The capital of France is", "max_tokens": 32, "stream_format": fmt}


@pytest.mark.parametrize(
    "capture", ["llamacpp-completions-sample.txt", "vllm-completions-token-ids.txt"]
)
async def test_msgpack_delta_carries_the_same_ids_as_msgpack(
    proxy: ProxyClient, upstream: FakeUpstream, capture: str
) -> None:
    upstream.script = Script(load_capture(capture))
    _, plain_headers, plain = await post(proxy, "/v1/completions", json=body("msgpack"))
    status, headers, delta = await post(proxy, "/v1/completions", json=body("msgpack-delta"))
    assert status == 200
    assert headers["Content-Type"] == "application/x-msgpack"
    assert (plain_headers["Codec-Stream-Format"], headers["Codec-Stream-Format"]) == (
        "msgpack",
        "msgpack-delta",
    )
    assert ids_of(frames_of(delta, "msgpack-delta")) == ids_of(frames_of(plain, "msgpack"))
    # Frame by frame: base_id is the previous frame's last ID, deltas are zigzag and chained.
    unpacker = msgpack.Unpacker()
    unpacker.feed(delta)
    maps = list(unpacker)
    assert maps[0]["base_id"] == 0
    assert all(set(m) <= {"base_id", "ids_delta", "done", "finish_reason"} for m in maps)
    last = 0
    for value, frame in zip(maps, frames_of(delta, "msgpack-delta"), strict=True):
        assert value["base_id"] == last
        last = frame.ids[-1] if frame.ids else last
    assert maps[-1]["done"] is True


async def test_protobuf_delta_is_answered_as_protobuf(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    upstream.script = Script(load_capture("llamacpp-completions-sample.txt"))
    _, _, plain = await post(proxy, "/v1/completions", json=body("protobuf"))
    status, headers, raw = await post(proxy, "/v1/completions", json=body("protobuf-delta"))
    assert status == 200
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["Codec-Stream-Format"] == "protobuf"
    # Frame boundaries follow network reads; the IDs are the same.
    assert ids_of(frames_of(raw, "protobuf")) == ids_of(frames_of(plain, "protobuf"))
    assert (await codecai_frames(raw, "protobuf"))[-1].finish_reason == "length"


async def test_prefixed_msgpack_is_never_a_delta_stream(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    # The website framing (Accept: application/codec+msgpack) applies to plain msgpack only.
    headers = {"Accept": "application/codec+msgpack"}
    _, response_headers, raw = await post(
        proxy, "/v1/completions", json=body("msgpack-delta"), headers=headers
    )
    assert response_headers["Content-Type"] == "application/x-msgpack"
    assert frames_of(raw, "msgpack-delta")[-1].done
