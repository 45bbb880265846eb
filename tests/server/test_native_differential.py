"""The native steady path against the Python path: the same reads give the same client bytes,
outcome and counters, whatever the captures, the cuts between reads, and the damage done to
them; and steady events do take the native step.

Real captures (vLLM, llama.cpp, completions and chat, tool calls, reasoning) and long streams
built from SmolLM2's own text are framed as chunks (mostly one per event, some merged or split,
some framed oddly), cut into reads, and some damaged (a byte flipped, inserted or dropped, the
stream cut short). Each goes once through the native step and once through the Python path
alone (tests/server/native_support.py drives a real `UpstreamConnection`). Seeds are pinned.
"""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path

import pytest

from proxy.core.bodies import CodecBody, RelayedBody
from proxy.core.steady import NATIVE
from proxy.tokenizers.vocabulary import Vocabulary
from tests.fake_upstream import load_capture
from tests.server.native_support import (
    FORMATS,
    HEAD,
    chunk_boundaries,
    codec_body,
    drive,
    framed,
    llamacpp_event,
    mutated,
    split,
    vllm_event,
)

pytestmark = pytest.mark.skipif(NATIVE is None, reason="built without the native steady path")

CORPUS = Path(__file__).resolve().parents[2] / "dictionaries" / "corpus" / "smollm2-generated.txt"
# (capture, chat)
CAPTURES = [
    ("vllm-completions-token-ids.txt", False),
    ("vllm-completions-sample.txt", False),
    ("vllm-completions-stop-sequence.txt", False),
    ("vllm-chat.txt", True),
    ("vllm-chat-tool-calls-synthetic.txt", True),
    ("vllm-chat-reasoning-synthetic.txt", True),
    ("llamacpp-completions-logprobs.txt", False),
    ("llamacpp-completions-emoji-logprobs.txt", False),
    ("llamacpp-completions-cut-utf8-logprobs.txt", False),
    ("llamacpp-completions-stop-logprobs.txt", False),
    ("llamacpp-completions-stop-holdback-logprobs.txt", False),
    ("llamacpp-completions-eos-logprobs.txt", False),
    ("llamacpp-chat-emoji-logprobs.txt", True),
    ("llamacpp-chat-usage.txt", True),
]
# How many streams each fuzz test runs (FUZZ_STREAMS raises it for a longer run, e.g. under
# the sanitizers: tests/server/test_native_sanitized.py).
STREAMS = int(os.environ.get("FUZZ_STREAMS", "40"))


def long_events(vocabulary: Vocabulary, rng: random.Random, *, chat: bool) -> list[bytes]:
    """A stream as a backend sends one: a first event, one token per event (the IDs of a
    character split over tokens wait for its last one), a finish, usage, [DONE]."""
    text = CORPUS.read_text()
    start = rng.randrange(0, len(text) - 3000)
    piece = text[start : start + rng.randint(200, 2500)]
    ids = vocabulary.scheme.encode(piece, at_start=True)
    table = vocabulary.token_bytes.table
    shape = rng.choice(["vllm", "vllm-logprobs", "llamacpp"])
    events, pending, waiting = [], b"", []
    for token in ids:
        pending += table[token]
        waiting.append(token)
        try:
            delta = pending.decode()
        except UnicodeDecodeError:
            continue
        if shape == "llamacpp":
            events.append(llamacpp_event(delta, waiting, chat=chat))
        else:
            events.append(vllm_event(delta, waiting, chat=chat, logprobs=shape == "vllm-logprobs"))
        pending, waiting = b"", []
    finish = b'"finish_reason":"length"'
    last = (
        events[-1]
        .replace(b'"finish_reason": null', finish)
        .replace(b'"finish_reason":null', finish)
    )
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"total_tokens":12}}\n\n'
    if rng.random() < 0.2:
        events = [e.replace(b"\n\n", b"\r\n\r\n") for e in events]
    return [*events[:-1], last, usage, b"data: [DONE]\n\n"]


def capture_events(rng: random.Random) -> tuple[list[bytes], bool]:
    name, chat = rng.choice(CAPTURES)
    return load_capture(name).events, chat


async def compare(body_factory, events: list[bytes], rng: random.Random, *, damage: bool) -> int:
    wire = HEAD + framed(events, rng, odd=damage)
    if damage and rng.random() < 0.7:
        wire = mutated(wire, rng)
    reads = split(wire, rng, chunk_boundaries(wire))
    cut = damage and rng.random() < 0.3
    if cut:
        reads = reads[: rng.randint(1, len(reads))]
    native = await drive(body_factory(), reads, native=True, cut=cut)
    python = await drive(body_factory(), reads, native=False, cut=cut)
    assert native.wire == python.wire
    assert native.ended == python.ended
    assert native.outcome == python.outcome
    assert native.counters == python.counters
    assert python.native_reads == 0
    return native.native_reads


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("damage", [False, True], ids=["clean", "damaged"])
async def test_codec_streams_are_the_same_both_ways(
    smollm2_vocabulary: Vocabulary, fmt: str, damage: bool
) -> None:
    rng = random.Random(f"codec-{fmt}-{damage}")
    native_reads = 0
    for index in range(STREAMS):
        if index % 2:
            events, chat = capture_events(rng)
        else:
            chat = rng.random() < 0.3
            events = long_events(smollm2_vocabulary, rng, chat=chat)
        mode = rng.choice(["auto", "auto", "backend", "retokenize"])
        native_reads += await compare(
            lambda chat=chat, mode=mode: codec_body(
                smollm2_vocabulary, chat=chat, fmt=fmt, token_ids=mode
            ),
            events,
            rng,
            damage=damage,
        )
    if not damage:
        assert native_reads > STREAMS * 20  # most steady reads did take the native step


@pytest.mark.parametrize("damage", [False, True], ids=["clean", "damaged"])
async def test_relayed_streams_are_the_same_both_ways(
    smollm2_vocabulary: Vocabulary, damage: bool
) -> None:
    rng = random.Random(f"relay-{damage}")
    native_reads = 0
    for index in range(STREAMS):
        events = (
            capture_events(rng)[0]
            if index % 2
            else long_events(smollm2_vocabulary, rng, chat=False)
        )
        native_reads += await compare(RelayedBody, events, rng, damage=damage)
    if not damage:
        assert native_reads > STREAMS * 20


async def test_steady_events_take_the_native_step(smollm2_vocabulary: Vocabulary) -> None:
    # One event per chunk, one chunk per read: every read after the first frame and before the
    # finish is the step's; a silent fall-back to Python would count none.
    rng = random.Random(7)
    events = long_events(smollm2_vocabulary, rng, chat=False)
    wire = HEAD + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    reads = _at(wire, chunk_boundaries(wire))
    body = codec_body(smollm2_vocabulary, chat=False, fmt="msgpack")
    native = await drive(body, reads, native=True, cut=False)
    python = await drive(
        codec_body(smollm2_vocabulary, chat=False, fmt="msgpack"), reads, native=False, cut=False
    )
    assert native.wire == python.wire
    assert native.ended == "complete"
    # The first event (its frame starts the response) and the last three (finish, usage,
    # [DONE] with the last chunk) are Python's.
    assert native.native_reads == len(events) - 4


def _at(wire: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *cuts[1:], len(wire)]
    return [wire[a:b] for a, b in itertools.pairwise(edges) if b > a]


@pytest.mark.parametrize("relayed", [False, True], ids=["codec", "relayed"])
async def test_a_size_line_begun_in_the_heads_read_is_left_to_llhttp(
    smollm2_vocabulary: Vocabulary, relayed: bool
) -> None:
    # llhttp reports a chunk boundary after the head, then nothing for the size line it has
    # begun: the step must not take over in the middle of that line (found by the fuzz).
    events = load_capture("vllm-completions-token-ids.txt").events
    wire = HEAD + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    reads = [wire[: len(HEAD) + 1], *split_at(wire, len(HEAD) + 1, chunk_boundaries(wire)[1:])]

    def body() -> RelayedBody | CodecBody:
        if relayed:
            return RelayedBody()
        return codec_body(smollm2_vocabulary, chat=False, fmt="msgpack")

    native = await drive(body(), reads, native=True, cut=False)
    python = await drive(body(), reads, native=False, cut=False)
    assert native.ended == python.ended == "complete"
    assert native.wire == python.wire
    assert native.native_reads > len(events) // 2


def split_at(wire: bytes, start: int, cuts: list[int]) -> list[bytes]:
    edges = [start, *cuts, len(wire)]
    return [wire[a:b] for a, b in itertools.pairwise(edges) if b > a]
