"""Helpers for the Codec entry-point tests: post a request, decode the frames strictly."""

from __future__ import annotations

from typing import Any, Literal

from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame
from tests.server.conftest import ProxyClient

Decodable = Literal["msgpack", "msgpack-delta", "protobuf"]


async def post(proxy: ProxyClient, path: str, **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
    async with proxy.post(path, **kwargs) as resp:
        return resp.status, dict(resp.headers), await resp.read()


def frames_of(raw: bytes, fmt: Decodable) -> list[Frame]:
    """Our strict decoder: exactly one terminal frame, last, nothing after it."""
    decoder = FrameDecoder(fmt)
    frames = decoder.feed(raw)
    decoder.flush()
    assert decoder.finished, "no terminal frame"
    assert [f.done for f in frames] == [False] * (len(frames) - 1) + [True]
    assert all(f.ids for f in frames[:-1]), "an empty non-terminal frame"
    return frames


def ids_of(frames: list[Frame]) -> list[int]:
    return [i for frame in frames for i in frame.ids]
