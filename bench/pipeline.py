"""CPU cost per token of the sans-IO pipeline alone (no HTTP), with a per-stage breakdown.

Used by bench/throughput.py (its "pipeline" part). One upstream SSE body is fed to
`CodecTranscoder` the way `CodecBody` (proxy/core/bodies.py) does it (feed each chunk, encode the
frames it returns, join them into one write), cut into chunks in two realistic ways:

- `event`: one SSE event per chunk, what a proxy sees when the backend generates slower than
  the proxy reads (the normal case: about one token per frame);
- `16KiB`: 16 KiB chunks, what a saturated proxy reads from a fast upstream (many tokens per
  frame).

Each stage is then timed alone on the inputs the real pipeline gave it:

- `sse`: `SSEDecoder.feed` over the chunks;
- `parse`: `parse_completion_chunk` over the event data (of which the JSON decoding alone);
- `retokenize`: the `Retokenizer.feed`/`flush` calls the transcoder made (of which the Hugging Face
  `Tokenizer.encode` calls it made, replayed alone, with and without reading `ids`, `offsets`
  and `word_ids` back into Python);
- `encode`: `FrameEncoder.encode` of the frames each chunk produced, joined;
- `glue`: the transcoder (without encoding) minus the stages above: its own bookkeeping
  (Frame objects, outcome checks, list handling).

Times are process CPU time (`time.process_time`), the best of several interleaved repeats
(the least disturbed), divided by the number of token IDs the stream produces.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from tokenizers import Encoding, Tokenizer

from bench.replay_upstream import split_events
from proxy.core.stream import chunks as chunks_module
from proxy.core.stream.chunks import ChunkResult, parse_completion_chunk
from proxy.core.stream.retokenizer import Retokenizer, RetokenizerScheme
from proxy.core.stream.sse import SSEDecoder
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.wire.frames import Frame, FrameEncoder, encoder_for

CHUNK_16K = 16 * 1024
FORMATS = ("msgpack", "protobuf")


def chunkings(body: bytes) -> dict[str, list[bytes]]:
    return {
        "event": split_events(body),
        "16KiB": [body[i : i + CHUNK_16K] for i in range(0, len(body), CHUNK_16K)],
    }


def best_cpu_seconds(
    functions: dict[str, Callable[[], object]], *, repeats: int, min_seconds: float
) -> dict[str, float]:
    """CPU seconds per call of each function: its best batch of >= min_seconds, over `repeats`.

    The functions take turns batch by batch, so a burst of load from other processes on a
    shared machine disturbs them all alike instead of one stage's whole measurement.
    """
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(repeats):
        for name, fn in functions.items():
            calls = 0
            start = time.process_time()
            while True:
                fn()
                calls += 1
                elapsed = time.process_time() - start
                if elapsed >= min_seconds:
                    break
            best[name] = min(best[name], elapsed / calls)
    return best


class _RecordingTokenizer:
    """Stands in for a `tokenizers.Tokenizer` inside a scheme and logs every encode call."""

    def __init__(self, inner: Tokenizer, log: list[tuple[Tokenizer, str]]) -> None:
        self._inner = inner
        self._log = log

    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        self._log.append((self._inner, text))
        return self._inner.encode(text, add_special_tokens=add_special_tokens)

    @property
    def normalizer(self) -> Any:
        return self._inner.normalizer


def recording_scheme(
    scheme: RetokenizerScheme,
) -> tuple[RetokenizerScheme, list[tuple[Tokenizer, str]]]:
    log: list[tuple[Tokenizer, str]] = []
    first = cast(Tokenizer, _RecordingTokenizer(scheme.first, log))
    rest = cast(Tokenizer, _RecordingTokenizer(scheme.rest, log))
    return dataclasses.replace(scheme, first=first, rest=rest), log


@dataclass
class Trace:
    """What the real pipeline did with one chunking: the inputs each stage saw, in order."""

    frame_groups: list[list[Frame]]  # frames returned per fed chunk (and at end of upstream)
    event_data: list[str]  # every event the transcoder parsed
    retokenizer_calls: list[str | None]  # feed(text), or None for flush()
    windows: list[tuple[Tokenizer, str]]  # every Hugging Face encode call
    ids: list[int]
    done_frames: int
    finish_reason: str | None


def trace(scheme: RetokenizerScheme, chunks: list[bytes]) -> Trace:
    """Run the real transcoder once, recording what reached each stage.

    Recorded rather than re-derived, so the breakdown follows whatever the transcoder does
    (per event or per read retokenizing, where it stops parsing).
    """
    recording, windows = recording_scheme(scheme)
    event_data: list[str] = []
    calls: list[str | None] = []

    def parse(data: str) -> ChunkResult:
        event_data.append(data)
        return parse_completion_chunk(data)

    original_feed, original_flush = Retokenizer.feed, Retokenizer.flush

    def feed(self: Retokenizer, text: str) -> list[int]:
        calls.append(text)
        return original_feed(self, text)

    def flush(self: Retokenizer) -> list[int]:
        calls.append(None)
        return original_flush(self)

    Retokenizer.feed = feed  # type: ignore[method-assign]
    Retokenizer.flush = flush  # type: ignore[method-assign]
    try:
        transcoder = CodecTranscoder(recording, parse)
        groups = [transcoder.feed(chunk) for chunk in chunks]
        groups.append(transcoder.flush())
    finally:
        Retokenizer.feed, Retokenizer.flush = original_feed, original_flush  # type: ignore[method-assign]
    frames = [frame for group in groups for frame in group]
    return Trace(
        frame_groups=[group for group in groups if group],
        event_data=event_data,
        retokenizer_calls=calls,
        windows=windows,
        ids=[token_id for frame in frames for token_id in frame.ids],
        done_frames=sum(frame.done for frame in frames),
        finish_reason=frames[-1].finish_reason if frames else None,
    )


def measure_chunking(
    scheme: RetokenizerScheme,
    chunks: list[bytes],
    expected_ids: list[int],
    *,
    repeats: int,
    min_seconds: float,
) -> dict[str, Any]:
    seen = trace(scheme, chunks)
    tokens = len(seen.ids)
    # The JSON decoder the chunk parser uses (orjson with a json fallback, or json).
    loads: Callable[[str], object] = getattr(chunks_module, "_loads", json.loads)
    encoders: dict[str, FrameEncoder] = {name: encoder_for(name) for name in FORMATS}

    def sse() -> None:
        decoder = SSEDecoder()
        for chunk in chunks:
            decoder.feed(chunk)

    def parse() -> None:
        for data in seen.event_data:
            parse_completion_chunk(data)

    def json_loads() -> None:
        for data in seen.event_data:
            loads(data)

    def retokenize() -> None:
        retokenizer = Retokenizer(scheme)
        for text in seen.retokenizer_calls:
            if text is None:
                retokenizer.flush()
            else:
                retokenizer.feed(text)

    def hf_encode() -> None:
        for tokenizer, text in seen.windows:
            tokenizer.encode(text, add_special_tokens=False)

    def hf_encode_and_read() -> None:
        for tokenizer, text in seen.windows:
            encoding = tokenizer.encode(text, add_special_tokens=False)
            _ = encoding.ids, encoding.offsets, encoding.word_ids

    def transcode_only() -> None:
        transcoder = CodecTranscoder(scheme, parse_completion_chunk)
        for chunk in chunks:
            transcoder.feed(chunk)
        transcoder.flush()

    def encode_with(encoder: FrameEncoder) -> Callable[[], None]:
        def encode() -> None:
            for group in seen.frame_groups:
                b"".join([encoder.encode(frame) for frame in group])

        return encode

    def pipeline_with(encoder: FrameEncoder) -> Callable[[], None]:
        # Exactly what CodecBody.feed does per upstream chunk, minus the IO.
        def pipeline() -> None:
            transcoder = CodecTranscoder(scheme, parse_completion_chunk)
            for chunk in chunks:
                frames = transcoder.feed(chunk)
                if frames:
                    b"".join([encoder.encode(frame) for frame in frames])
            frames = transcoder.flush()
            if frames:
                b"".join([encoder.encode(frame) for frame in frames])

        return pipeline

    functions: dict[str, Callable[[], object]] = {
        "sse": sse,
        "parse": parse,
        "parse.json_loads": json_loads,
        "retokenize": retokenize,
        "retokenize.hf_encode": hf_encode,
        "retokenize.hf_encode+read_fields": hf_encode_and_read,
        "transcoder_without_encode": transcode_only,
    }
    for name, encoder in encoders.items():
        functions[f"encode.{name}"] = encode_with(encoder)
        functions[f"total.{name}"] = pipeline_with(encoder)
    seconds = best_cpu_seconds(functions, repeats=repeats, min_seconds=min_seconds)
    stages = {name: value / tokens * 1e6 for name, value in seconds.items()}
    glue = stages["transcoder_without_encode"] - (
        stages["sse"] + stages["parse"] + stages["retokenize"]
    )
    frames = sum(len(group) for group in seen.frame_groups)
    window_chars = [len(text) for _, text in seen.windows]
    return {
        "chunks": len(chunks),
        "events": len(seen.event_data),
        "tokens": tokens,
        "frames": frames,
        "ids_per_frame": tokens / frames if frames else None,
        "retokenizer_feeds": sum(call is not None for call in seen.retokenizer_calls),
        "hf_encode_calls": len(seen.windows),
        "mean_window_chars": sum(window_chars) / len(window_chars) if window_chars else None,
        "checks": {
            "ids_equal_tokenizer_encode_of_text": seen.ids == expected_ids,
            "one_done_frame": seen.done_frames == 1,
            "finish_reason": seen.finish_reason,
        },
        "us_per_token": stages | {"glue": glue},
        "tokens_per_cpu_second": {name: 1e6 / stages[f"total.{name}"] for name in encoders},
    }


def run_pipeline(
    scheme: RetokenizerScheme,
    body: bytes,
    expected_ids: list[int],
    *,
    quick: bool,
) -> dict[str, Any]:
    repeats, min_seconds = (2, 0.03) if quick else (15, 0.15)
    return {
        name: measure_chunking(
            scheme, chunks, expected_ids, repeats=repeats, min_seconds=min_seconds
        )
        for name, chunks in chunkings(body).items()
    }
