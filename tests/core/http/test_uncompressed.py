"""Which responses go uncompressed: a model's, or an API key's (BREACH, docs/COMPRESSION.md)."""

from __future__ import annotations

import pytest

from proxy.core.http.uncompressed import uncompressed


@pytest.mark.parametrize(
    ("model", "key", "keys", "expected"),
    [
        (False, "", (), False),
        (True, "", (), True),
        (False, "k1", ("k1", "k2"), True),
        (False, "k3", ("k1", "k2"), False),
        (False, "", ("",), False),  # no key is no key, whatever the list holds
        (False, "k1", (), False),
        (True, "k3", ("k1",), True),
    ],
)
def test_a_models_or_a_keys_responses(
    model: bool, key: str, keys: tuple[str, ...], expected: bool
) -> None:
    assert uncompressed(model=model, key=key, keys=keys) is expected
