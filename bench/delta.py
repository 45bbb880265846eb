"""Bytes per token of `msgpack-delta` against plain `msgpack` (and `protobuf` for reference).

    python bench/delta.py [--tokenizer PATH] [--tokens N]

The token stream is real text tokenized with the model's tokenizer (default: the bundled
SmolLM2's): Python's own documentation (`pydoc_data.topics`, shipped with CPython, PSF
license). Frames are cut every K tokens (K = 1 is what the proxy sends when the backend streams
one token per chunk, larger K when reads batch several chunks), each stream ends with a
terminal frame, and every encoder is the proxy's own (proxy/core/wire/frames.py).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from pydoc_data.topics import topics

from bench._common import tokenizer_arguments
from proxy.core.wire.frames import Frame, FrameEncoder, encoder_for

FRAME_SIZES = (1, 2, 4, 8, 16, 64)
FORMATS = ("msgpack", "msgpack-delta", "protobuf")


def corpus_ids(tokenizer_path: Path, limit: int) -> list[int]:
    from proxy.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path).tokenizer
    text = "\n\n".join(topics[key] for key in sorted(topics))
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    return ids[:limit]


def stream_bytes(encoder: FrameEncoder, ids: list[int], per_frame: int) -> int:
    frames = [Frame(tuple(ids[i : i + per_frame])) for i in range(0, len(ids), per_frame)]
    frames.append(Frame((), True, "length"))
    return sum(len(encoder.encode(frame)) for frame in frames)


def main() -> None:
    args = tokenizer_arguments(__doc__.split("\n\n")[0])
    ids = corpus_ids(args.tokenizer, args.tokens)
    steps = [abs(b - a) for a, b in itertools.pairwise(ids)]
    small = sum(step < 64 for step in steps) / max(1, len(steps))
    print(f"{len(ids)} tokens of pydoc_data.topics, tokenizer {args.tokenizer.name}")
    print(f"consecutive IDs within 63 of each other (one-byte zigzag delta): {small:.1%}\n")
    columns = " | ".join(f"{f} B/token" for f in FORMATS)
    print(f"| IDs per frame | {columns} | delta vs msgpack |")
    print("|---:|" + "---:|" * (len(FORMATS) + 1))
    for per_frame in FRAME_SIZES:
        # A fresh encoder per stream: delta encoders carry the previous frame's last ID.
        sizes = {f: stream_bytes(encoder_for(f), ids, per_frame) / len(ids) for f in FORMATS}
        change = sizes["msgpack-delta"] / sizes["msgpack"] - 1
        cells = " | ".join(f"{sizes[f]:.2f}" for f in FORMATS)
        print(f"| {per_frame} | {cells} | {change:+.1%} |")


if __name__ == "__main__":
    main()
