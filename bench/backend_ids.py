"""What checking backend-reported IDs against the text costs per token (`--token-ids backend`).

    python bench/backend_ids.py [--tokenizer PATH] [--tokens N]

The text is Python's own documentation (`pydoc_data.topics`, as in bench/delta.py), tokenized
with the model's tokenizer (default: the bundled SmolLM2's). Each stream is fed to
proxy/core/stream/backend_ids.py chunk by chunk, as the transcoder does, in the shapes the
backends send: one ID per chunk with its text (llama.cpp, vLLM one token at a time); the text
cut at random characters with each ID in the chunk its first byte is in (IDs running ahead of
the text, as vLLM's do around held-back characters); and that stream with one chunk in 20
reporting a wrong ID (a retokenized span each). The incremental retokenizer fed the same
chunks is the reference. Best of several rounds; nothing is asserted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pydoc_data.topics import topics

from bench._common import tokenizer_arguments
from proxy.core.stream.backend_ids import BackendIds
from proxy.core.stream.retokenizer import Retokenizer
from proxy.tokenizers.vocabulary import Vocabulary

Chunk = tuple[str, tuple[int, ...] | None]
ROUNDS = 5


def one_id_per_chunk(vocabulary: Vocabulary, ids: list[int]) -> list[Chunk]:
    # A chunk's text is what its ID completes (the text of an incomplete character waits).
    chunks: list[Chunk] = []
    held = b""
    for token_id in ids:
        pieces = vocabulary.token_bytes.render([token_id])
        assert pieces is not None
        held += pieces[0]
        try:
            text, held = held.decode(), b""
        except UnicodeDecodeError:
            text = ""
        chunks.append((text, (token_id,)))
    return chunks


def running_ahead(vocabulary: Vocabulary, text: str, ids: list[int]) -> list[Chunk]:
    rng = random.Random(7)
    bounds = sorted({0, *rng.sample(range(1, len(text)), len(ids) // 2)})
    pieces = [text[a:b] for a, b in zip(bounds, [*bounds[1:], len(text)], strict=True)]
    starts = iter([len(text[:bound].encode()) for bound in bounds[1:]])
    grouped: list[list[int]] = [[] for _ in pieces]
    chunk, offset, next_start = 0, 0, next(starts, None)
    for token_id in ids:
        while next_start is not None and offset >= next_start:
            chunk, next_start = chunk + 1, next(starts, None)
        grouped[chunk].append(token_id)
        rendered = vocabulary.token_bytes.render([token_id])
        assert rendered is not None
        offset += len(rendered[0])
    return [(piece, tuple(group)) for piece, group in zip(pieces, grouped, strict=True)]


def corrupted(chunks: list[Chunk]) -> list[Chunk]:
    return [
        (text, (0,) * len(ids or ()) if i % 20 == 19 else ids)
        for i, (text, ids) in enumerate(chunks)
    ]


def best_per_token(run: Callable[[], object], tokens: int) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best / tokens * 1e6


def main() -> None:
    args = tokenizer_arguments(__doc__.split("\n\n")[0])
    from proxy.tokenizers import load_tokenizer

    vocabulary = Vocabulary.build(load_tokenizer(args.tokenizer))
    corpus = "\n\n".join(topics[key] for key in sorted(topics))
    tokenizer = vocabulary.loaded.tokenizer
    ids: list[int] = tokenizer.encode(corpus, add_special_tokens=False).ids[: args.tokens]
    text = tokenizer.decode(ids)
    ahead = running_ahead(vocabulary, text, ids)
    shapes = {
        "one ID per chunk": one_id_per_chunk(vocabulary, ids),
        "IDs running ahead of the text": ahead,
        "... and 1 chunk in 20 wrong": corrupted(ahead),
    }

    def backend(chunks: list[Chunk]) -> Callable[[], list[int]]:
        def run() -> list[int]:
            source = BackendIds(vocabulary.scheme, vocabulary.token_bytes)
            out = [
                i for chunk_text, chunk_ids in chunks for i in source.feed(chunk_text, chunk_ids)
            ]
            return out + source.flush()

        return run

    def retokenized(chunks: list[Chunk]) -> Callable[[], object]:
        def run() -> list[int]:
            retokenizer = Retokenizer(vocabulary.scheme)
            return [i for chunk_text, _ in chunks for i in retokenizer.feed(chunk_text)]

        return run

    print(f"{len(ids)} tokens of pydoc_data.topics, tokenizer {args.tokenizer.name}\n")
    print("| chunks | chunks per token | backend IDs µs/token | retokenizer µs/token |")
    print("|---|---:|---:|---:|")
    for name, chunks in shapes.items():
        out = backend(chunks)()
        # Exact IDs where they are right; exact text where some are not.
        assert out == ids if "wrong" not in name else tokenizer.decode(out) == text
        print(
            f"| {name} | {len(chunks) / len(ids):.2f} "
            f"| {best_per_token(backend(chunks), len(ids)):.2f} "
            f"| {best_per_token(retokenized(chunks), len(ids)):.2f} |"
        )


if __name__ == "__main__":
    main()
