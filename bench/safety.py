"""Safety-policy cost and holdback, in process (no HTTP): what enforcement adds per token.

    .venv/bin/python bench/safety.py [--policy config/safety-policy.example.toml] [--tokens N]

The stream is the text of tests/fixtures/upstream/llamacpp-completions-sample.txt (clean
under the example policy) repeated to N tokens (SmolLM2's IDs), fed as a Codec stream is:
one feed per upstream event (one token each, the worst case for per-call overhead) and one per
16 tokens. Printed:

- matcher cost per token (token texts + the three detectors + release), median of 5 runs;
- the JSON path's cost per token (retokenizer + matcher), for comparison;
- holdback on the clean stream: how many tokens the matcher held after each feed (max, mean);
- the whole Codec pipeline per one-token upstream event (SSE, chunk, retokenizer, frames) with
  and without the guard and policy: the overhead in context, on the same machine and load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from proxy import assets
from proxy.core.guard import StreamGuard
from proxy.core.http.versioning import V0_4
from proxy.core.safety.policy import SafetyPolicy
from proxy.core.safety.stream import PolicedIds, PolicedText
from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.transcode import CodecTranscoder
from proxy.server.models.policy_file import read_policy_file
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary

REPO = Path(__file__).resolve().parent.parent
CAPTURE = REPO / "tests" / "fixtures" / "upstream" / "llamacpp-completions-sample.txt"


def pipeline(vocabulary: Vocabulary, policy: SafetyPolicy | None) -> float:
    """Seconds per one-token upstream event through transcoder (+ guard and policy)."""
    events = [e + b"\n\n" for e in CAPTURE.read_bytes().split(b"\n\n") if e]
    body = events[:-3] * 60  # the token events only: the stream never finishes
    runs = []
    for _ in range(5):
        source = CodecTranscoder(vocabulary.scheme, parse_completion_chunk)
        policed = None if policy is None else PolicedIds(policy.rules, vocabulary.loaded.tokenizer)
        guard = StreamGuard(source, V0_4, policed)
        started = time.perf_counter()
        for event in body:
            guard.feed(event)
        runs.append((time.perf_counter() - started) / len(body))
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", type=Path, default=REPO / "config/safety-policy.example.toml")
    parser.add_argument("--tokens", type=int, default=20_000)
    args = parser.parse_args()
    loaded = load_tokenizer(assets.SMOLLM2_GGUF.ensure())
    vocabulary = Vocabulary.build(loaded)
    policy = read_policy_file(args.policy, loaded)
    sample = (
        ", the city of New Haven was a thriving metropolis, with towering skyscrapers and "
        "bustling streets. But as the years went by, the city began to lose its way. "
    )
    text = sample
    while len(loaded.tokenizer.encode(text, add_special_tokens=False).ids) < args.tokens:
        text += sample
    ids = loaded.tokenizer.encode(text, add_special_tokens=False).ids[: args.tokens]
    deltas = [loaded.tokenizer.decode([i]) for i in ids]

    for batch in (1, 16):
        runs, held = [], []
        for _ in range(5):
            policed = PolicedIds(policy.rules, loaded.tokenizer)
            started = time.perf_counter()
            for start in range(0, len(ids), batch):
                out = policed.feed(ids[start : start + batch])
                assert out.stop is None
                held.append(policed.held)
            policed.flush()
            runs.append((time.perf_counter() - started) / len(ids))
        print(
            f"Codec, {batch:2d} token(s) per feed: {statistics.median(runs) * 1e6:6.2f} µs/token;"
            f" held after a feed: max {max(held)}, mean {statistics.fmean(held):.2f} tokens"
        )
    runs = []
    for _ in range(5):
        text_policed = PolicedText(policy.rules, vocabulary.scheme, loaded.tokenizer)
        started = time.perf_counter()
        for delta in deltas:
            text_policed.feed(delta)
        text_policed.flush()
        runs.append((time.perf_counter() - started) / len(ids))
    cost = statistics.median(runs) * 1e6
    print(f"JSON (retokenize + match), 1 delta per token: {cost:6.2f} µs/token")
    plain, policed_cost = pipeline(vocabulary, None), pipeline(vocabulary, policy)
    print(
        f"Codec pipeline per one-token event: {plain * 1e6:6.1f} µs without a policy, "
        f"{policed_cost * 1e6:6.1f} µs with it (+{(policed_cost / plain - 1) * 100:.0f}%)"
    )
    id_bound, char_bound = policy.rules.max_holdback
    print(f"bound for {policy.id}: {id_bound} tokens (ID sequences), {char_bound} characters")


if __name__ == "__main__":
    main()
