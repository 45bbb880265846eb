"""`codec-proxy dict train`: a zstd dictionary for one wire format, reproducibly.

    codec-proxy dict train --tokenizer PATH --format msgpack|protobuf \\
        --corpus DIR_OR_FILE --out FILE [--size 16384] [--seed 3]

The corpus (text files, or a directory of them; gzip-compressed files are read as text) is
tokenized with the model's tokenizer and cut into sample streams built with the proxy's own
frame encoders (core/compression/dict_samples.py). 80% of the streams train the dictionary
(`zstandard.train_dictionary`, one thread and a dictionary ID derived from the samples, so the
same inputs give the same bytes); the held-out 20% measure it against zstd without one. The
dictionary is written to FILE and its entry to `manifest.json` beside it.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from proxy.core.compression.compressors import ZstdCompressor
from proxy.core.compression.dict_samples import sample_streams
from proxy.core.compression.dictionaries import (
    DEFAULT_ZSTD_LEVEL,
    LoadedZstdDictionary,
    ManifestEntry,
    parse_manifest,
    render_manifest,
    sha256_hex,
    vocabulary_sha256,
)
from proxy.core.wire.frames import encoder_for
from proxy.dictionaries.load import MANIFEST_NAME
from proxy.tokenizers import TokenizerLoadError, load_tokenizer

HOLDOUT = 0.2
_DOCUMENT_BREAK = re.compile(r"\n\s*\n")


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", type=Path, required=True, help="GGUF or tokenizer.json")
    parser.add_argument("--format", choices=("msgpack", "protobuf"), required=True)
    parser.add_argument("--corpus", type=Path, required=True, help="a text file or a directory")
    parser.add_argument("--out", type=Path, required=True, help="where the dictionary goes")
    parser.add_argument("--size", type=int, default=16384, help="dictionary bytes (16384)")
    parser.add_argument("--seed", type=int, default=3, help="sample-stream seed (3)")
    parser.add_argument("--corpus-summary", help="one line naming the corpus and its licence")


@dataclass(frozen=True)
class HoldoutResult:
    streams: int
    identity_bytes: int
    zstd_bytes: int
    dict_bytes: int

    @property
    def gain(self) -> float:
        return 1.0 - self.dict_bytes / self.zstd_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "identity_bytes": self.identity_bytes,
            "zstd_no_dict_bytes": self.zstd_bytes,
            "zstd_dict_bytes": self.dict_bytes,
            "gain_vs_zstd_no_dict": round(self.gain, 4),
        }


def corpus_files(corpus: Path) -> list[Path]:
    if corpus.is_dir():
        return sorted(p for p in corpus.rglob("*") if p.is_file() and not p.name.startswith("."))
    return [corpus]


def read_text(path: Path) -> str:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip (also dictd's .dict.dz)
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", errors="replace")


def corpus_documents(corpus: Path) -> list[str]:
    return [
        doc.strip()
        for path in corpus_files(corpus)
        for doc in _DOCUMENT_BREAK.split(read_text(path))
        if doc.strip()
    ]


def train(samples: Sequence[bytes], size: int, *, level: int = DEFAULT_ZSTD_LEVEL) -> bytes:
    # ZDICT picks a random ID unless told: derive it from the samples, in the range the zstd
    # format leaves to users (32768 .. 2^31-1), so the output is reproducible.
    digest = hashlib.sha256(b"".join(samples)).digest()
    dict_id = 32768 + int.from_bytes(digest[:4], "big") % (2**31 - 32768)
    trained = zstandard.train_dictionary(
        size, list(samples), dict_id=dict_id, level=level, threads=1
    )
    return bytes(trained.as_bytes())


def evaluate(dictionary: LoadedZstdDictionary, holdout: Sequence[bytes]) -> HoldoutResult:
    plain = zstandard.ZstdCompressor(level=dictionary.level)
    with_dict = 0
    for stream in holdout:
        compressor = ZstdCompressor(dictionary)
        with_dict += len(compressor.feed(stream) + compressor.flush())
    return HoldoutResult(
        streams=len(holdout),
        identity_bytes=sum(map(len, holdout)),
        zstd_bytes=sum(len(plain.compress(stream)) for stream in holdout),
        dict_bytes=with_dict,
    )


def run_train(args: argparse.Namespace) -> int:
    try:
        loaded = load_tokenizer(args.tokenizer)
    except TokenizerLoadError as exc:
        raise SystemExit(f"codec-proxy: {exc.message}") from exc
    documents = corpus_documents(args.corpus)
    if not documents:
        raise SystemExit(f"codec-proxy: no text in {args.corpus}")
    ids = [
        token_id
        for encoding in loaded.tokenizer.encode_batch(documents, add_special_tokens=False)
        for token_id in encoding.ids
    ]
    encoder = encoder_for(args.format)
    streams = list(sample_streams(ids, encoder, seed=args.seed))
    random.Random(args.seed).shuffle(streams)
    split = max(1, round(len(streams) * (1 - HOLDOUT)))
    training, holdout = streams[:split], streams[split:]
    if not holdout:
        raise SystemExit("codec-proxy: corpus too small for a held-out 20%")
    data = train(training, args.size)
    dictionary = LoadedZstdDictionary.build(args.format, data)
    result = evaluate(dictionary, holdout)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    entry = ManifestEntry(
        file=args.out.name,
        format=args.format,
        sha256=sha256_hex(data),
        size_bytes=len(data),
        tokenizer=args.tokenizer.name,
        # RFC 3339 date-time, as the map schema's `trained_at` requires.
        trained_at=datetime.datetime.now(datetime.UTC)
        .replace(microsecond=0)
        .isoformat()
        .replace("+00:00", "Z"),
        corpus_summary=args.corpus_summary or f"{len(documents)} documents from {args.corpus}",
        extra={
            "vocabulary_sha256": vocabulary_sha256(loaded.tokenizer.get_vocab(True)),
            "zstd_level": dictionary.level,
            "corpus_tokens": len(ids),
            "sample_streams": {"training": len(training), "holdout": len(holdout)},
            "holdout": result.to_json(),
            "command": " ".join(
                [
                    "codec-proxy dict train",
                    f"--tokenizer {args.tokenizer.name}",
                    f"--format {args.format}",
                    f"--corpus {args.corpus}",
                    f"--out {args.out}",
                    f"--size {args.size}",
                    f"--seed {args.seed}",
                ]
            ),
        },
    )
    _write_manifest_entry(args.out.parent / MANIFEST_NAME, entry)
    print(
        f"{args.out}: {len(data)} bytes, sha256:{entry.sha256}; held-out {len(holdout)} streams "
        f"{result.zstd_bytes} B without dictionary -> {result.dict_bytes} B with "
        f"({result.gain:.1%} smaller)",
        file=sys.stderr,
    )
    return 0


def _write_manifest_entry(manifest: Path, entry: ManifestEntry) -> None:
    entries = (
        parse_manifest(manifest.read_text(), source=str(manifest)) if manifest.exists() else []
    )
    entries = [e for e in entries if e.file != entry.file] + [entry]
    manifest.write_text(render_manifest(entries))
