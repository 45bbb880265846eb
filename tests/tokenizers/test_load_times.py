"""How long `load_tokenizer` takes per source: reported, not asserted (machines differ)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.tokenizers.support import FAMILIES, TokenizerCache, family_path


def test_report_load_times(
    load_cached: TokenizerCache,
    record_property: Callable[[str, object], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = []
    for family in FAMILIES:
        path = family_path(family)
        loaded = load_cached(path)
        seconds = load_cached.seconds[path]
        record_property(f"load_seconds[{family}]", round(seconds, 3))
        lines.append(f"  {family:<13} {seconds:5.2f} s  vocab {loaded.vocab_size:>6}  {path.name}")
    with capsys.disabled():
        print("\nload_tokenizer, first load in this session:\n" + "\n".join(lines))
