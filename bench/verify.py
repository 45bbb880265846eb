"""What verifying a sampled Codec stream costs per token (proxy/core/verify/).

    PYTHONPATH=. python bench/verify.py [--tokenizer PATH] [--tokens N]

The text is Python's own documentation (`pydoc_data.topics`, as in bench/backend_ids.py),
tokenized with the model's tokenizer (default: the bundled SmolLM2's), and the decoder is built
from the map the proxy publishes for it. The verifier alone is fed in the shapes streams have:
one ID per frame, each after the text it completes (llama.cpp, one token per chunk); eight IDs
per frame (several events in one read); and the IDs one token ahead of the text (a backend
holding back text). Then the whole Codec body, a llama.cpp-shaped SSE stream of the same text
retokenized, framed and encoded, without and with verification: the difference is what a
sampled stream costs on top. Best of several rounds; nothing is asserted but the verdicts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pydoc_data.topics import topics

from bench._common import tokenizer_arguments
from proxy.core.bodies import verified_codec_body
from proxy.core.compression.body_writer import IDENTITY_FLUSH, BodyWriter
from proxy.core.compression.compressors import new_compressor
from proxy.core.guard import StreamGuard
from proxy.core.http.versioning import V0_4
from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.verify.verifier import StreamVerifier
from proxy.core.wire.frames import encoder_for
from proxy.maps.publish import publish
from proxy.tokenizers.vocabulary import Vocabulary

ROUNDS = 5
Step = tuple[str, tuple[int, ...]]  # text arriving, then IDs leaving


def token_texts(decoder: MapDecoder, ids: list[int]) -> list[str]:
    # A chunk's text is what its ID completes (the text of an incomplete character waits).
    texts: list[str] = []
    held = b""
    for token_id in ids:
        held += decoder.piece(token_id) or b""
        try:
            text, held = held.decode(), b""
        except UnicodeDecodeError:
            text = ""
        texts.append(text)
    return texts


def best_seconds(*runs: Callable[[], object], rounds: int = ROUNDS) -> list[float]:
    """Each run's best time; the runs take turns, so a busy spell slows all of them alike."""
    best = [float("inf")] * len(runs)
    for _ in range(rounds):
        for index, run in enumerate(runs):
            started = time.perf_counter()
            run()
            best[index] = min(best[index], time.perf_counter() - started)
    return best


def verifier_run(decoder: MapDecoder, steps: list[Step]) -> Callable[[], object]:
    def run() -> object:
        verifier = StreamVerifier(decoder)
        text, ids = verifier.text, verifier.ids
        for chunk_text, chunk_ids in steps:
            text(chunk_text)
            ids(chunk_ids)
        verdict = verifier.flush("length")
        assert verdict.agreed, verdict
        return verdict

    return run


def sse_stream(texts: list[str]) -> list[bytes]:
    """llama.cpp's completions shape, one token per event, cut into 4 KiB reads."""
    events = [
        b"data: "
        + json.dumps({"choices": [{"text": text, "index": 0, "finish_reason": None}]}).encode()
        + b"\n\n"
        for text in texts
    ]
    final = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}
    body = b"".join(events) + b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n"
    return [body[start : start + 4096] for start in range(0, len(body), 4096)]


def body_run(
    vocabulary: Vocabulary, decoder: MapDecoder | None, reads: list[bytes]
) -> Callable[[], object]:
    def run() -> object:
        transcoder = CodecTranscoder(vocabulary.scheme, parse_completion_chunk)
        writer = BodyWriter(
            encoder_for("msgpack"), new_compressor("identity", None), IDENTITY_FLUSH
        )
        body = verified_codec_body(transcoder, StreamGuard(transcoder, V0_4), writer, decoder)
        for index, data in enumerate(reads):
            body.feed(data, float(index))
        body.flush(float(len(reads)))
        assert decoder is None or (body.verification is not None and body.verification.agreed)
        return body

    return run


def main() -> None:
    args = tokenizer_arguments(__doc__.split("\n\n")[0])
    from proxy.tokenizers import load_tokenizer

    vocabulary = Vocabulary.build(load_tokenizer(args.tokenizer))
    published = publish(vocabulary.loaded, None, content=vocabulary.map_content)
    started = time.perf_counter()
    decoder = MapDecoder.from_map(published.body)
    build_ms = (time.perf_counter() - started) * 1e3

    corpus = "\n\n".join(topics[key] for key in sorted(topics))
    tokenizer = vocabulary.loaded.tokenizer
    ids: list[int] = tokenizer.encode(corpus, add_special_tokens=False).ids[: args.tokens]
    texts = token_texts(decoder, ids)
    tokens = len(ids)
    eight = [("".join(texts[i : i + 8]), tuple(ids[i : i + 8])) for i in range(0, tokens, 8)]
    shapes: dict[str, list[Step]] = {
        "one ID per frame, after its text": list(zip(texts, [(i,) for i in ids], strict=True)),
        "eight IDs per frame": eight,
        "IDs one token ahead of the text": list(
            zip(["", *texts], [(i,) for i in ids] + [()], strict=True)
        ),
    }

    print(
        f"{tokens} tokens of pydoc_data.topics, tokenizer {args.tokenizer.name}; "
        f"decoder built from the {len(published.body) / 1e6:.1f} MB map in {build_ms:.0f} ms\n"
    )
    print("| verifier alone | µs/token |")
    print("|---|---:|")
    for name, steps in shapes.items():
        (seconds,) = best_seconds(verifier_run(decoder, steps))
        per_token = seconds / tokens * 1e6
        print(f"| {name} | {per_token:.2f} |")

    reads = sse_stream(texts)
    plain, verified = (
        seconds / tokens * 1e6
        for seconds in best_seconds(
            body_run(vocabulary, None, reads), body_run(vocabulary, decoder, reads), rounds=11
        )
    )
    print("\n| Codec body (retokenized, msgpack, identity) | µs/token |")
    print("|---|---:|")
    print(f"| not sampled | {plain:.2f} |")
    print(f"| sampled (verified) | {verified:.2f} |")
    print(f"| verification's share | {verified - plain:.2f} ({(verified / plain - 1):.0%}) |")


if __name__ == "__main__":
    main()
