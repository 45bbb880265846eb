"""Helpers for the Codec entry-point tests: post a request, decode the frames strictly."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import pytest

from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame
from proxy.tokenizers.vocabulary import Vocabulary
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


def with_swapped_map_ids(vocabulary: Vocabulary, text: str) -> Vocabulary:
    """The same tokenizer, publishing a map in which the first two IDs `text` encodes to are
    swapped: the frames stay what the tokenizer gives, and a client decoding them with the
    published map reads other text (what continuous verification must catch)."""
    ids = vocabulary.loaded.tokenizer.encode(text, add_special_tokens=False).ids
    first, second = list(dict.fromkeys(ids))[:2]
    content = vocabulary.map_content
    swap = {first: second, second: first}
    vocab = {token: swap.get(i, i) for token, i in content.vocab.items()}
    swapped = Vocabulary(vocabulary.loaded, vocabulary.scheme, vocabulary.token_bytes)
    # `map_content` is a cached property: seeding its cache is how the published map changes.
    swapped.__dict__["map_content"] = dataclasses.replace(content, vocab=vocab)
    return swapped


async def wait_for(predicate: Callable[[], bool], seconds: float = 3.0) -> None:
    """Until `predicate()` holds; fails the test after `seconds`."""
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def access_line(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The request's access-log line, written once the handler is done (after the body)."""
    for _ in range(100):
        lines = [r.fields for r in caplog.records if hasattr(r, "fields")]
        if lines:
            (line,) = lines
            fields: dict[str, Any] = line
            return fields
        await asyncio.sleep(0.02)
    raise AssertionError("no access-log line")
