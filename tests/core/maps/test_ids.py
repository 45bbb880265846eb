"""Map ids: publishable ones pass unchanged, everything that could traverse paths is refused."""

from __future__ import annotations

import pytest

from proxy.core.errors import TokenizerMapError
from proxy.core.maps.ids import checked_map_id, derive_map_id, map_id_problem


@pytest.mark.parametrize(
    "map_id", ["qwen/qwen2", "meta-llama/llama-3.1", "smollm2-135m-instruct.q4_1", "a", "a_b/c-d.e"]
)
def test_publishable_ids(map_id: str) -> None:
    assert map_id_problem(map_id) is None
    assert checked_map_id(map_id) == map_id


@pytest.mark.parametrize(
    "map_id",
    [
        "",
        "Qwen/qwen2",  # uppercase
        "qwen/../etc",
        "..",
        "a..b",
        "/qwen",
        "qwen/",
        "qwen//qwen2",
        "./qwen",
        "qwen/./x",
        "qwen%2fx",
        "qwen qwen",
        "qwen\\x",
        "sha256/abc",  # the content-addressed subtree
        "caf\u00e9",
    ],
)
def test_refused_ids(map_id: str) -> None:
    assert map_id_problem(map_id) is not None
    with pytest.raises(TokenizerMapError, match="map id"):
        checked_map_id(map_id)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("SmolLM2-135M-Instruct.Q4_1", "smollm2-135m-instruct.q4_1"),
        ("Llama 3.1 (8B)", "llama-3.1-8b"),
        ("..hidden..name..", "hidden.name"),
        ("Ünïcödé", "n-c-d"),
        ("!!!", "model"),
        ("", "model"),
    ],
)
def test_derived_ids_are_publishable(name: str, expected: str) -> None:
    assert derive_map_id(name) == expected
    assert map_id_problem(expected) is None
