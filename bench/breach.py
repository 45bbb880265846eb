"""Compression as a length oracle (BREACH): what a compressed answer's length tells an observer
when the answer holds a secret beside text a third party chose.

    PYTHONPATH=. python bench/breach.py      # about a minute; no server, no network

One answer holds a secret (a 20-character hex token, as an API key or a session id in a
model's context would be) and, later, text the attacker chose: here the attacker's guess,
echoed (a document the model quotes, a message it repeats back). Every body goes through the
proxy's own compressors as the proxy sends it (bench/compression.py's simulators): JSON whole
(`CompressedWholeBody`'s one compression), JSON-SSE on the flush schedule (`CompressedEventsBody`,
50 ms, vLLM's chat chunks, one token an event at 50 tokens/s), and Codec frames on the same
schedule (msgpack and protobuf, gzip, br and dictionary zstd). Time is simulated, so every figure
is the same on every run and every machine.

Two questions, for each body:

* a whole guess: the compressed length when the guess is the secret, against wrong guesses of
  the same length and alphabet (drawn from 2000, seeded);
* the attack that recovers a secret a character at a time: with the first k characters known,
  is the answer whose guess adds the right next character strictly the smallest of the 16
  candidates? Counted over the secret's 20 positions.

A stream's length also counts its events and frames, one a token, and a guess's tokens depend on
its characters; an attacker knows the tokenizer and compares like with like, so each answer is
compared only with those of as many tokens (wrong guesses of another count are left out).
"""

from __future__ import annotations

import random
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.compression import (  # noqa: E402
    RATE,
    Sim,
    Trace,
    _sse,
    _token_texts,
    simulate,
    simulate_json,
    transcode,
)
from proxy import assets  # noqa: E402
from proxy.core.compression.compressors import new_compressor, plain_compressor  # noqa: E402
from proxy.core.compression.dictionaries import ZstdDictionaries  # noqa: E402
from proxy.core.stream.retokenizer import RetokenizerScheme  # noqa: E402
from proxy.core.wire.frames import encoder_for  # noqa: E402
from proxy.dictionaries.load import load_dictionaries  # noqa: E402
from proxy.settings import DEFAULT_DICTIONARIES_MANIFEST  # noqa: E402
from proxy.tokenizers import LoadedTokenizer, load_tokenizer  # noqa: E402
from proxy.tokenizers.vocabulary import Vocabulary  # noqa: E402

SECRET = "7f3a9c2e41d8b6a05e19"
HEX = "0123456789abcdef"
WRONG_GUESSES = 2000
INTERVAL_MS = 50.0
MAX_FRAMES = 32


def answer(guess: str) -> str:
    """An answer with the secret in it and, later, the attacker's text."""
    return (
        f"Here is the configuration you asked for. The deployment token is {SECRET}, valid "
        "until the end of the month; keep it out of shared documents. The note you sent reads: "
        f'"please confirm token {guess}". Anything else I can help with?'
    )


def chat_completion(text: str) -> bytes:
    """The whole answer as vLLM's non-streamed chat completion."""
    return orjson.dumps(
        {
            "id": "chatcmpl-826f5e977a72f916",
            "object": "chat.completion",
            "created": 1795977989,
            "model": "smollm2",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 40, "completion_tokens": 60, "total_tokens": 100},
        }
    )


def tokens(tokenizer: LoadedTokenizer, text: str) -> list[int]:
    return list(tokenizer.tokenizer.encode(text, add_special_tokens=False).ids)


def trace(tokenizer: LoadedTokenizer, text: str) -> Trace:
    """The answer streamed, one token an event at `RATE` tokens a second (vLLM's completion
    chunks, as bench/compression.py streams its corpora)."""
    ids = tokens(tokenizer, text)
    deltas = _token_texts(tokenizer, ids)
    events = [(i / RATE, _sse(delta, None)) for i, delta in enumerate(deltas)]
    events.append((len(deltas) / RATE, _sse("", "stop") + b"data: [DONE]\n\n"))
    return Trace("breach", len(ids), tuple(events))


Measure = Callable[[str], int]


def measures(
    tokenizer: LoadedTokenizer, scheme: RetokenizerScheme, dictionaries: ZstdDictionaries
) -> dict[tuple[str, str], Measure]:
    """(body, coding) -> the length on the wire of the answer with a given guess."""

    def whole(coding: str) -> Measure:
        def length(guess: str) -> int:
            compressor = plain_compressor(coding)  # type: ignore[arg-type]
            return len(compressor.feed(chat_completion(answer(guess))) + compressor.flush())

        return length

    def events(coding: str) -> Measure:
        def length(guess: str) -> int:
            sent, _ = simulate_json(
                trace(tokenizer, answer(guess)),
                coding,  # type: ignore[arg-type]
                INTERVAL_MS / 1000,
                max_frames=MAX_FRAMES,
            )
            return sent

        return length

    def frames(fmt: str, coding: str) -> Measure:
        dictionary = dictionaries.for_format(fmt) if coding == "zstd" else None

        def length(guess: str) -> int:
            sim = Sim()
            simulate(
                transcode(trace(tokenizer, answer(guess)), scheme),
                encoder_for(fmt),
                new_compressor(coding, dictionary),  # type: ignore[arg-type]
                INTERVAL_MS / 1000,
                max_frames=MAX_FRAMES,
                merge=True,
                into=sim,
            )
            return sim.bytes

        return length

    found: dict[tuple[str, str], Measure] = {}
    for coding in ("identity", "gzip", "br", "zstd"):
        found[("JSON, whole", coding)] = whole(coding)
    for coding in ("gzip", "br", "zstd"):
        found[("JSON-SSE, 50 ms", coding)] = events(coding)
    for fmt in ("msgpack", "protobuf"):
        for coding in ("identity", "gzip", "br", "zstd"):
            found[(f"Codec {fmt}, 50 ms", coding)] = frames(fmt, coding)
    return found


Count = Callable[[str], int]


def whole_guess(measure: Measure, wrong: Sequence[str]) -> tuple[int, list[int]]:
    """The right guess's length, and the wrong ones'."""
    return measure(SECRET), [measure(guess) for guess in wrong]


def stands_out(right: int, wrong: Sequence[int]) -> str:
    """Whether the right guess's length is outside every wrong one's: a guess an observer of
    lengths tells from the others."""
    if right < min(wrong):
        return "smaller than all"
    if right > max(wrong):
        return "larger than all"
    return "no"


def by_character(measure: Measure, count: Count) -> int:
    """Positions of the secret at which the right next character gives strictly the smallest
    answer among the candidates of as many tokens."""
    found = 0
    for known in range(len(SECRET)):
        right = SECRET[: known + 1]
        others = [
            SECRET[:known] + c
            for c in HEX
            if c != SECRET[known] and count(SECRET[:known] + c) == count(right)
        ]
        smallest = measure(right)
        found += all(measure(guess) > smallest for guess in others)
    return found


def main() -> None:
    tokenizer = load_tokenizer(assets.SMOLLM2_GGUF.ensure())
    scheme = Vocabulary.build(tokenizer).scheme
    dictionaries = load_dictionaries(DEFAULT_DICTIONARIES_MANIFEST)
    rng = random.Random(0)

    def count(guess: str) -> int:
        return len(tokens(tokenizer, answer(guess)))

    drawn = ["".join(rng.choice(HEX) for _ in SECRET) for _ in range(WRONG_GUESSES)]
    wrong = [guess for guess in drawn if count(guess) == count(SECRET)]
    print(
        f"secret {len(SECRET)} hex characters; {len(wrong)} of {WRONG_GUESSES} wrong whole "
        f"guesses (seed 0) of as many tokens as the right one ({count(SECRET)})\n"
    )
    print(
        "| body | coding | right guess (B) | wrong guesses (B): median, range "
        "| right guess stands out | next character found |"
    )
    print("|---|---|---:|---|---|---:|")
    for (body, coding), measure in measures(tokenizer, scheme, dictionaries).items():
        right, lengths = whole_guess(measure, wrong)
        shown = "dict-zstd" if coding == "zstd" and body.startswith("Codec") else coding
        print(
            f"| {body} | {shown} | {right} | {statistics.median(lengths):g}, "
            f"{min(lengths)}-{max(lengths)} | {stands_out(right, lengths)} "
            f"| {by_character(measure, count)} of {len(SECRET)} |"
        )


if __name__ == "__main__":
    main()
