"""Sample streams for zstd dictionary training, shaped like what the proxy really sends.

A dictionary only helps with byte patterns it has seen, so the samples are whole Codec
response bodies built with the proxy's own frame encoders: the first frame alone (flushed at
once), then one frame per flush window, as `merge_frames` makes them, and a terminal frame
with the last IDs of the read and a spec `finish_reason`. How many tokens a window holds
depends on the upstream's speed and the flush interval; the window sizes below cover 1 (a
slow upstream or `--flush-interval-ms 0`) to 16 (a fast one). Stream lengths are spread
log-uniformly over 16..2048 tokens. Everything is drawn from a seeded
`random.Random`, so the same corpus and seed give the same samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import Final

from proxy.core.wire import finish
from proxy.core.wire.frames import Frame, FrameEncoder

MIN_TOKENS: Final = 16
MAX_TOKENS: Final = 2048
# Tokens per frame after the first, (size, weight): a 50 ms window holds 2-3 tokens at
# 50 tokens/s and about 10 at 200; the weights lean to small windows, where per-frame bytes
# dominate and a dictionary helps most.
WINDOW_SIZES: Final = ((1, 30), (2, 20), (3, 15), (4, 10), (6, 10), (8, 8), (12, 4), (16, 3))
FINISH_REASONS: Final = ((finish.LENGTH, 5), (finish.EOS_TOKEN, 4), (finish.STOP_SEQUENCE, 1))


def stream_frames(ids: Sequence[int], rng: random.Random) -> list[Frame]:
    """One response's frames for these token IDs (at least one ID)."""
    sizes = [size for size, _ in WINDOW_SIZES]
    size_weights = [weight for _, weight in WINDOW_SIZES]
    reasons = [reason for reason, _ in FINISH_REASONS]
    reason_weights = [weight for _, weight in FINISH_REASONS]
    frames = []
    first = rng.choice((1, 1, 1, 2))
    cut = min(first, len(ids))
    frames.append(Frame(tuple(ids[:cut])))
    while cut < len(ids):
        size = rng.choices(sizes, size_weights)[0]
        frames.append(Frame(tuple(ids[cut : cut + size])))
        cut += size
    # The last read's IDs ride on the terminal frame (interop.md §0.4); half the time the
    # finish arrives in a read of its own, with no IDs.
    reason = rng.choices(reasons, reason_weights)[0]
    last = frames.pop() if len(frames) > 1 and rng.random() < 0.5 else Frame(())
    frames.append(Frame(last.ids, done=True, finish_reason=reason))
    return frames


def sample_streams(
    token_ids: Sequence[int], encoder: FrameEncoder, *, seed: int, count: int | None = None
) -> Iterator[bytes]:
    """Encoded response bodies cut from consecutive runs of `token_ids`.

    Without `count`, the runs tile the corpus once (every token used once); with it, runs
    start at random places.
    """
    rng = random.Random(seed)
    total = len(token_ids)
    if total < MIN_TOKENS:
        return
    position = 0
    made = 0
    while count is None or made < count:
        length = round(math.exp(rng.uniform(math.log(MIN_TOKENS), math.log(MAX_TOKENS))))
        if count is None:
            if position + MIN_TOKENS > total:
                return
            run = token_ids[position : position + length]
            position += len(run)
        else:
            start = rng.randrange(0, max(1, total - length))
            run = token_ids[start : start + length]
        yield b"".join(encoder.encode(frame) for frame in stream_frames(run, rng))
        made += 1
