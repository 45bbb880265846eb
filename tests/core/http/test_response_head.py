"""What of an upstream's response head is relayed (proxy/core/http/response_head.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.http.response_head import (
    MAX_REASON_BYTES,
    relayed_reason,
    status_refusal,
    transfer_coding_refusal,
)


@pytest.mark.parametrize("status", [100, 103, 200, 204, 404, 500, 599])
def test_statuses_of_rfc_9110_are_relayed(status: int) -> None:
    assert status_refusal(status) is None


@pytest.mark.parametrize("status", [0, 99, 600, 999])
def test_statuses_outside_100_599_are_refused(status: int) -> None:
    assert status_refusal(status) == f"status {status} is outside 100-599"


def test_a_switch_of_protocols_nobody_asked_for_is_refused() -> None:
    refusal = status_refusal(101)
    assert refusal is not None
    assert "switch protocols" in refusal


@pytest.mark.parametrize("values", [[], ["chunked"], ["Chunked"], [" chunked "]])
def test_one_chunked_coding_or_none_is_read(values: list[str]) -> None:
    assert transfer_coding_refusal(values) is None


@pytest.mark.parametrize(
    "values",
    [
        ["xchunked"],  # llhttp reads it as "not chunked": until the close
        ["chunked, identity"],  # chunked is not the last coding (RFC 9112 §6.3)
        ["gzip, chunked"],  # de-chunked, the content would still be gzip'd
        ["chunked", "chunked"],  # chunked twice (RFC 9112 §7)
        ["chunked,"],
        [""],
        ["identity"],
    ],
)
def test_any_other_transfer_coding_is_refused(values: list[str]) -> None:
    refusal = transfer_coding_refusal(values)
    assert refusal is not None
    assert refusal.startswith("Transfer-Encoding ")


def test_a_refused_transfer_coding_is_shown_bounded() -> None:
    refusal = transfer_coding_refusal(["x" * 10_000])
    assert refusal is not None
    assert len(refusal) < 200


@pytest.mark.parametrize(
    "reason", [b"", b"OK", b"Not Found", b"Fine\tthanks", b"~" * MAX_REASON_BYTES]
)
def test_a_printable_reason_phrase_is_relayed_as_sent(reason: bytes) -> None:
    assert relayed_reason(reason) == reason.decode("ascii")


@pytest.mark.parametrize(
    "reason", [b"O\x01K", b"OK\x7f", b"OK\x00", b"caf\xe9", b"x" * (MAX_REASON_BYTES + 1)]
)
def test_any_other_reason_phrase_gives_way_to_the_proxys_own(reason: bytes) -> None:
    assert relayed_reason(reason) is None


@given(st.binary(max_size=MAX_REASON_BYTES + 8))
def test_a_relayed_reason_phrase_is_printable_ascii_and_bounded(reason: bytes) -> None:
    relayed = relayed_reason(reason)
    if relayed is not None:
        assert relayed.encode("ascii") == reason
        assert len(reason) <= MAX_REASON_BYTES
        assert all(c == "\t" or " " <= c <= "~" for c in relayed)
