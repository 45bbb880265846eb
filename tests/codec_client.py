"""The real reference client, `codecai` 0.4.1, wired up for tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import codecai

from proxy.tokenizers import LoadedTokenizer


async def _chunks(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def codecai_frames(body: bytes, fmt: str, *, chunk: int = 7) -> list[codecai.CodecFrame]:
    """Decode a whole Codec body with codecai's stream decoder, fed in small pieces."""
    decode = codecai.decode_protobuf_stream if fmt == "protobuf" else codecai.decode_msgpack_stream
    return [frame async for frame in decode(_chunks(body, chunk))]


def codecai_map(loaded: LoadedTokenizer, map_id: str = "test/tokenizer") -> codecai.TokenizerMap:
    """A codecai tokenizer map built from our tokenizer, as a client would load it."""
    document = json.loads(loaded.tokenizer.to_str())
    vocab = loaded.tokenizer.get_vocab(with_added_tokens=True)
    merges = [m if isinstance(m, str) else " ".join(m) for m in document["model"].get("merges", [])]
    return codecai.TokenizerMap(
        id=map_id,
        version="2",
        vocab_size=loaded.vocab_size,
        vocab=vocab,
        encoder=loaded.encoder,
        merges=merges,
        special_tokens=dict(loaded.special_tokens),
    )


def render(tokenizer_map: codecai.TokenizerMap, frames: list[codecai.CodecFrame]) -> str:
    """Text of a frame stream, rendered incrementally as a streaming client does."""
    detokenizer = codecai.Detokenizer(tokenizer_map)
    return "".join(detokenizer.render(f.ids, partial=not f.done) for f in frames)
