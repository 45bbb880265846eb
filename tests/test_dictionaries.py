"""zstd dictionaries: the shipped ones, the manifest, loading with sha256 checks, training."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.core.compression.dict_samples import (
    MAX_TOKENS,
    MIN_TOKENS,
    sample_streams,
    stream_frames,
)
from proxy.core.compression.dictionaries import (
    DictionaryError,
    LoadedZstdDictionary,
    ZstdDictionaries,
    declared_dictionaries,
    parse_manifest,
    sha256_hex,
    vocabulary_sha256,
)
from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import encoder_for
from proxy.dictionaries.load import load_dictionaries
from proxy.settings import DEFAULT_DICTIONARIES_MANIFEST
from proxy.tokenizers import LoadedTokenizer
from tests.compression_support import shipped_dictionaries

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "dictionaries"


def test_shipped_manifest_lists_one_verified_dictionary_per_format(
    smollm2_tokenizer: LoadedTokenizer,
) -> None:
    manifest = json.loads(DEFAULT_DICTIONARIES_MANIFEST.read_text())
    entries = parse_manifest(DEFAULT_DICTIONARIES_MANIFEST.read_text())
    assert sorted(e.format for e in entries) == ["msgpack", "protobuf"]
    vocab = vocabulary_sha256(smollm2_tokenizer.tokenizer.get_vocab(True))
    for entry, raw in zip(entries, manifest["dictionaries"], strict=True):
        data = (SHIPPED / entry.file).read_bytes()
        assert sha256_hex(data) == entry.sha256
        assert len(data) == entry.size_bytes
        assert entry.extra["vocabulary_sha256"] == vocab  # trained for the bundled model
        # What the manifest must say of its corpus: its origin, and that it may be redistributed.
        assert raw["trained_at"]
        assert raw["holdout"]["gain_vs_zstd_no_dict"] > 0
        assert "codec-proxy dict train" in raw["command"]
        assert "SmolLM2" in raw["corpus_summary"]
    loaded = load_dictionaries(DEFAULT_DICTIONARIES_MANIFEST, vocabulary_sha256=vocab)
    assert len(loaded) == 2


def copy_shipped(tmp_path: Path) -> Path:
    target = tmp_path / "dicts"
    shutil.copytree(SHIPPED, target, ignore=shutil.ignore_patterns("corpus"))
    return target / "manifest.json"


def test_a_changed_dictionary_is_refused(tmp_path: Path) -> None:
    manifest = copy_shipped(tmp_path)
    entry = parse_manifest(manifest.read_text())[0]
    path = manifest.parent / entry.file
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(DictionaryError, match="does not match its manifest"):
        load_dictionaries(manifest)


def test_explicit_dictionary_is_checked_against_the_manifest_beside_it(tmp_path: Path) -> None:
    manifest = copy_shipped(tmp_path)
    entry = next(e for e in parse_manifest(manifest.read_text()) if e.format == "msgpack")
    path = manifest.parent / entry.file
    loaded = load_dictionaries(None, [f"msgpack={path}"])
    assert loaded.for_format("msgpack") is not None
    assert loaded.for_format("protobuf") is None
    with pytest.raises(DictionaryError, match="lists it as a msgpack"):
        load_dictionaries(None, [f"protobuf={path}"])
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(DictionaryError, match="does not match"):
        load_dictionaries(None, [f"msgpack={path}"])


def test_explicit_dictionary_in_no_manifest_is_served_by_its_own_hash(tmp_path: Path) -> None:
    entry = parse_manifest(DEFAULT_DICTIONARIES_MANIFEST.read_text())[0]
    path = tmp_path / "mine.zstd"
    path.write_bytes((SHIPPED / entry.file).read_bytes())
    loaded = load_dictionaries(DEFAULT_DICTIONARIES_MANIFEST, [f"protobuf={path}"])
    protobuf = loaded.for_format("protobuf")
    assert protobuf is not None
    assert protobuf.record.hash == f"sha256:{entry.sha256}"


@pytest.mark.parametrize("option", ["json=/x", "msgpack", "=x", "msgpack="])
def test_bad_dict_option(option: str) -> None:
    with pytest.raises(DictionaryError, match="FORMAT=PATH"):
        load_dictionaries(None, [option])


def test_other_tokenizers_skip_the_shipped_dictionaries() -> None:
    loaded = load_dictionaries(DEFAULT_DICTIONARIES_MANIFEST, vocabulary_sha256="0" * 64)
    assert len(loaded) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("{}", "no 'dictionaries' list"),
        ('{"dictionaries": [1]}', "not an object"),
        ('{"dictionaries": [{"file": "a"}]}', "'format' must be a string"),
        (
            '{"dictionaries": [{"file": "a", "format": "msgpack", "sha256": "' + "0" * 64 + '",'
            ' "tokenizer": "t", "size_bytes": 1, "trained_at": "2026-11-29"}]}',
            "not an RFC 3339 date-time",
        ),
    ],
)
def test_malformed_manifest(text: str, message: str) -> None:
    with pytest.raises(DictionaryError, match=message):
        parse_manifest(text)


def test_record_is_the_tokenizer_map_entry() -> None:
    data = (
        SHIPPED / parse_manifest(DEFAULT_DICTIONARIES_MANIFEST.read_text())[0].file
    ).read_bytes()
    loaded = LoadedZstdDictionary.build("msgpack", data, trained_at="2026-01-01T00:00:00Z")
    digest = sha256_hex(data)
    assert loaded.record.to_json() == {
        "format": "msgpack",
        "url": f"/.well-known/codec/dicts/{digest}.zstd",
        "hash": f"sha256:{digest}",
        "size_bytes": len(data),
        "trained_at": "2026-01-01T00:00:00Z",
    }
    assert ZstdDictionaries([loaded]).records == (loaded.record,)
    with pytest.raises(DictionaryError, match="two zstd dictionaries"):
        ZstdDictionaries([loaded, loaded])
    with pytest.raises(DictionaryError, match="not a usable zstd dictionary"):
        LoadedZstdDictionary.build("msgpack", b"\x37\xa4\x30\xec" + bytes(100))


@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
def test_sample_streams_are_real_codec_bodies(fmt: str) -> None:
    ids = list(range(1000, 9000))
    bodies = list(sample_streams(ids, encoder_for(fmt), seed=1))
    total = 0
    for body in bodies:
        decoder = FrameDecoder(fmt)  # type: ignore[arg-type]
        frames = decoder.feed(body)
        decoder.flush()
        assert frames[-1].done
        assert frames[-1].finish_reason
        assert all(f.ids for f in frames[:-1])
        stream_ids = [i for f in frames for i in f.ids]
        assert stream_ids == ids[total : total + len(stream_ids)]  # consecutive, each once
        total += len(stream_ids)
        assert len(stream_ids) <= MAX_TOKENS
    assert total >= len(ids) - MIN_TOKENS
    assert bodies == list(sample_streams(ids, encoder_for(fmt), seed=1))  # reproducible


def test_first_frame_is_small_like_the_proxys() -> None:
    rng = random.Random(0)
    for _ in range(50):
        frames = stream_frames(list(range(100)), rng)
        assert 1 <= len(frames[0].ids) <= 2


def test_training_is_reproducible(tmp_path: Path, smollm2_gguf: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join(
            f"Paragraph {i}: the quick brown fox jumps over the lazy dog {i * 7} times, "
            f"and then it rests in the shade of tree number {i % 13}." * 3
            for i in range(400)
        )
    )
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / run / "test-msgpack.zstd"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy",
                "dict",
                "train",
                "--tokenizer",
                str(smollm2_gguf),
                "--format",
                "msgpack",
                "--corpus",
                str(corpus),
                "--out",
                str(out),
                "--size",
                "4096",
                "--corpus-summary",
                "synthetic test text",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        outputs.append(out.read_bytes())
        (entry,) = parse_manifest((out.parent / "manifest.json").read_text())
        assert entry.file == out.name
        assert entry.sha256 == sha256_hex(outputs[-1])
        assert entry.corpus_summary == "synthetic test text"
        assert (
            entry.extra["holdout"]["zstd_dict_bytes"] < entry.extra["holdout"]["zstd_no_dict_bytes"]
        )
    assert outputs[0] == outputs[1]
    # The trained dictionary loads like the shipped ones.
    assert len(load_dictionaries(tmp_path / "a" / "manifest.json")) == 1


def test_a_map_documents_dictionaries_read_back_by_format_and_digest() -> None:
    records = [r.to_json() for r in shipped_dictionaries().records]
    document = {
        "zstd_dictionaries": [
            *records,
            {"format": "json", "hash": records[0]["hash"]},  # not a wire format
            {"format": "msgpack", "hash": "sha256:abc"},  # no whole digest
            {"format": "msgpack"},
            "not an entry",
        ]
    }
    assert declared_dictionaries(document) == tuple(
        (r["format"], r["hash"].removeprefix("sha256:")) for r in records
    )
    assert declared_dictionaries({}) == ()
    assert declared_dictionaries({"zstd_dictionaries": {"format": "msgpack"}}) == ()
