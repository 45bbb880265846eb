"""Our fast GGUF metadata reader returns what the `gguf` package's reference reader returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

from proxy.tokenizers import TokenizerLoadError
from proxy.tokenizers.gguf_metadata import read_gguf_metadata

SCALARS: list[tuple[str, Any, GGUFValueType]] = [
    ("t.u8", 200, GGUFValueType.UINT8),
    ("t.i8", -100, GGUFValueType.INT8),
    ("t.u16", 60000, GGUFValueType.UINT16),
    ("t.i16", -30000, GGUFValueType.INT16),
    ("t.u32", 4_000_000_000, GGUFValueType.UINT32),
    ("t.i32", -2_000_000_000, GGUFValueType.INT32),
    ("t.f32", 0.5, GGUFValueType.FLOAT32),
    ("t.bool", True, GGUFValueType.BOOL),
    ("t.u64", 2**63 + 5, GGUFValueType.UINT64),
    ("t.i64", -(2**62), GGUFValueType.INT64),
    ("t.f64", -1.25e-300, GGUFValueType.FLOAT64),
    ("t.str", "héllo ▁ 🎉", GGUFValueType.STRING),
]
ARRAYS: list[tuple[str, list[Any], GGUFValueType]] = [
    ("a.i8", [-1, 0, 1], GGUFValueType.INT8),
    ("a.u32", [0, 1, 2**32 - 1], GGUFValueType.UINT32),
    ("a.i32", [-5, 3, 1, 4], GGUFValueType.INT32),
    ("a.f32", [0.25, -2.0], GGUFValueType.FLOAT32),
    ("a.bool", [True, False, True], GGUFValueType.BOOL),
    ("a.i64", [-(2**40), 2**40], GGUFValueType.INT64),
    ("a.str", ["Ġhello", "", "<|im_start|>", "你好"], GGUFValueType.STRING),
]
NESTED = [[1, 2], [3]]


def write_all_types(path: Path, endianess: GGUFEndian) -> Path:
    writer = GGUFWriter(path, arch="test", endianess=endianess)
    for key, value, vtype in SCALARS:
        writer.add_key_value(key, value, vtype)
    for key, values, sub_type in ARRAYS:
        writer.add_key_value(key, values, GGUFValueType.ARRAY, sub_type=sub_type)
    writer.add_array("a.nested", NESTED)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["le", "be"])
def test_matches_reference_reader(tmp_path: Path, endianess: GGUFEndian) -> None:
    path = write_all_types(tmp_path / "all.gguf", endianess)
    ours = read_gguf_metadata(path)
    reference = GGUFReader(path)
    assert ours.version == 3
    for key, _value, _vtype in [*SCALARS, *ARRAYS]:
        expected = reference.fields[key].contents()
        got = ours.values[key]
        assert (got.tolist() if isinstance(got, np.ndarray) else got) == expected, key
    # gguf-py flattens nested arrays; the specification (and we) keep the nesting.
    nested = ours.values["a.nested"]
    assert isinstance(nested, list)
    assert [a.tolist() for a in nested if isinstance(a, np.ndarray)] == NESTED
    assert ours.values["general.architecture"] == "test"


def test_numeric_arrays_are_native_byte_order(tmp_path: Path) -> None:
    path = write_all_types(tmp_path / "be.gguf", GGUFEndian.BIG)
    array = read_gguf_metadata(path).values["a.i32"]
    assert isinstance(array, np.ndarray)
    assert array.dtype.isnative
    assert array.tolist() == [-5, 3, 1, 4]


def test_reads_only_requested_keys(tmp_path: Path) -> None:
    path = write_all_types(tmp_path / "all.gguf", GGUFEndian.LITTLE)
    meta = read_gguf_metadata(path, {"a.str", "t.u8", "absent.key"})
    assert dict(meta.values) == {"t.u8": 200, "a.str": ["Ġhello", "", "<|im_start|>", "你好"]}
    assert "a.str" in meta
    assert "absent.key" not in meta


def test_every_truncation_is_an_error(tmp_path: Path) -> None:
    whole = write_all_types(tmp_path / "all.gguf", GGUFEndian.LITTLE).read_bytes()
    metadata_end = len(whole) - 32  # leave the alignment padding out of the sweep
    cut = tmp_path / "cut.gguf"
    for size in range(1, metadata_end, 7):
        cut.write_bytes(whole[:size])
        with pytest.raises(TokenizerLoadError) as info:
            read_gguf_metadata(cut)
        assert info.value.message.startswith(f"{cut}: "), size


def test_reads_a_large_vocabulary(vocab_dir: Path) -> None:
    # GGUFReader needs about 20 s for this file on the build machine (one numpy view per
    # string); this is the reason the module exists. Timings are reported by test_load_times.
    meta = read_gguf_metadata(vocab_dir / "ggml-vocab-llama-bpe.gguf")
    tokens = meta.values["tokenizer.ggml.tokens"]
    merges = meta.values["tokenizer.ggml.merges"]
    assert isinstance(tokens, list)
    assert isinstance(merges, list)
    assert (len(tokens), len(merges)) == (128256, 280147)
    assert tokens[128000] == "<|begin_of_text|>"
    assert merges[0] == "Ġ Ġ"
