"""`Accept` media types (RFC 9110 §12.5.1) and the one qvalue grammar (§12.4.2)."""

from __future__ import annotations

import pytest

from proxy.core.http import negotiation
from proxy.core.http.negotiation import accepted_media_types, parse_qvalue, wants_prefixed_msgpack
from proxy.core.wire.formats import PREFIXED_MSGPACK_MEDIA_TYPE


@pytest.mark.parametrize(
    ("raw", "q"),
    [("1", 1.0), ("1.000", 1.0), ("0", 0.0), ("0.5", 0.5), (" 0.125 ", 0.125),
     ("1.5", None), ("2", None), ("0.1234", None), ("", None), ("x", None), ("-0", None)],
)  # fmt: skip
def test_qvalue_grammar(raw: str, q: float | None) -> None:
    assert parse_qvalue(raw) == q


def test_accept_is_lowercased_and_weighted() -> None:
    assert accepted_media_types("Application/Codec+MsgPack;q=0.5, */*;q=0") == {
        PREFIXED_MSGPACK_MEDIA_TYPE: 0.5,
        "*/*": 0.0,
    }


@pytest.mark.parametrize(
    ("accept", "prefixed"),
    [(None, False), ("", False), ("*/*", False), (PREFIXED_MSGPACK_MEDIA_TYPE, True),
     (f"{PREFIXED_MSGPACK_MEDIA_TYPE};q=0", False), (f"{PREFIXED_MSGPACK_MEDIA_TYPE};q=7", False),
     (f"text/plain, {PREFIXED_MSGPACK_MEDIA_TYPE};q=0.1", True)],
)  # fmt: skip
def test_prefixed_msgpack_only_when_named_with_a_weight(accept: str | None, prefixed: bool) -> None:
    assert wants_prefixed_msgpack(accept) is prefixed


def test_an_accept_field_is_read_once_for_every_request_that_sends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[str] = []

    def counted(value: str) -> dict[str, float]:
        read.append(value)
        return accepted_media_types(value)

    monkeypatch.setattr(negotiation, "accepted_media_types", counted)
    field = f"{PREFIXED_MSGPACK_MEDIA_TYPE}, application/x-once-per-field;q=0.5"
    assert [wants_prefixed_msgpack(field) for _ in range(3)] == [True] * 3
    assert read == [field]
