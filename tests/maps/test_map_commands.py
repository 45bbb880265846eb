"""`codec-proxy map generate|verify`, run in process on real files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.core.maps.tokenizer_map import PublishedMap
from proxy.maps.publish import publish
from proxy.tokenizers import LoadedTokenizer
from tests.maps.conftest import write_map
from tests.tokenizers.support import write_gguf


def test_generate_writes_what_the_server_serves(
    tmp_path: Path, tiny_loaded: LoadedTokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny.json"
    assert (
        main(
            [
                "map",
                "generate",
                "--tokenizer",
                str(tiny_loaded.source),
                "--id",
                "t/x",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    served = publish(tiny_loaded, "t/x")
    assert out.read_bytes() == served.body
    summary = capsys.readouterr().err
    assert f"t/x {served.hash} ({len(served.body)} bytes" in summary
    assert "pre_tokenizer_program yes" in summary


def test_generate_to_stdout(
    tiny_loaded: LoadedTokenizer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert main(["map", "generate", "--tokenizer", str(tiny_loaded.source), "--id", "t/x"]) == 0
    assert capsysbinary.readouterr().out == publish(tiny_loaded, "t/x").body


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "Bad/ID"], "codec-proxy map: map id 'Bad/ID' must be lowercase"),
        (
            ["--id", "t/x", "--tokenizer", "/nonexistent.gguf"],
            "codec-proxy map: /nonexistent.gguf: no such file",
        ),
    ],
)
def test_generate_failures_are_one_line(
    tiny_loaded: LoadedTokenizer, args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["map", "generate", "--tokenizer", str(tiny_loaded.source), *args])
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_verify_a_good_map_against_its_tokenizer(
    tmp_path: Path,
    tiny_map: PublishedMap,
    tiny_loaded: LoadedTokenizer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "tiny.json"
    path.write_bytes(tiny_map.body)
    assert main(["map", "verify", str(path), "--tokenizer", str(tiny_loaded.source)]) == 0
    out = capsys.readouterr().out
    assert f"sha256:{hashlib.sha256(tiny_map.body).hexdigest()}" in out
    assert "ok: valid Codec tokenizer map 'test/tiny' and matches" in out


def test_verify_names_schema_problems(
    tmp_path: Path, tiny_document: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_document["version"] = 2
    path = write_map(tmp_path / "bad.json", tiny_document)
    assert main(["map", "verify", str(path)]) == 1
    assert "problem: $.version:" in capsys.readouterr().out


def test_verify_names_cross_field_problems(
    tmp_path: Path, tiny_document: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_document["vocab_size"] = 3
    path = write_map(tmp_path / "bad.json", tiny_document)
    assert main(["map", "verify", str(path)]) == 1
    assert "is not below vocab_size 3" in capsys.readouterr().out


def test_verify_against_another_tokenizer_fails(
    tmp_path: Path, tiny_map: PublishedMap, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_gguf(tmp_path / "other.gguf", pre="gpt-2")  # same vocabulary, GPT-2 regex
    path = tmp_path / "tiny.json"
    path.write_bytes(tiny_map.body)
    assert main(["map", "verify", str(path), "--tokenizer", str(other)]) == 1
    out = capsys.readouterr().out
    assert "problem: pre_tokenizer_pattern:" in out
    assert "problem: pre_tokenizer_program:" in out


def test_verify_a_file_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.json"
    path.write_text("{not json")
    assert main(["map", "verify", str(path)]) == 1
    assert "problem: not JSON" in capsys.readouterr().out


def test_verify_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"cannot read .*missing\.json"):
        main(["map", "verify", str(tmp_path / "missing.json")])


def test_generated_map_is_json_with_the_requested_id(
    tmp_path: Path, tiny_loaded: LoadedTokenizer
) -> None:
    out = tmp_path / "m.json"
    main(
        [
            "map",
            "generate",
            "--tokenizer",
            str(tiny_loaded.source),
            "--id",
            "org/tiny",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_bytes())["id"] == "org/tiny"
