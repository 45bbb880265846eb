"""Token-ID prompts counted and checked in slices (proxy/core/wire/prompt_ids.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import PayloadTooLarge
from proxy.core.wire import prompt_ids
from proxy.core.wire.prompt_ids import PromptLimits, item_types, outside_vocabulary


def test_too_many_ids_are_a_413_prompt_too_long() -> None:
    limits = PromptLimits(vocab_size=10, max_ids=3)
    limits.check_count(3)
    with pytest.raises(PayloadTooLarge) as info:
        limits.check_count(4)
    assert (info.value.status_hint, info.value.code) == (413, "prompt_too_long")
    assert "4 token IDs" in info.value.message
    assert "max_prompt_ids" in info.value.message


def test_bools_are_not_ints() -> None:
    assert item_types([1, 2, 3]) == {int}
    assert item_types([1, True]) == {int, bool}
    assert item_types([]) == set()


@given(st.lists(st.integers(-5, 20), max_size=60), st.integers(1, 7))
def test_slices_see_every_item(ids: list[int], slice_size: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prompt_ids, "SLICE", slice_size)
        found = outside_vocabulary(ids, 16)
        types = item_types([*ids, "x"])
    bad = [i for i in ids if not 0 <= i < 16]
    assert (found is None) == (not bad)
    assert found is None or found in bad
    assert types == ({int, str} if ids else {str})
