"""Hop-by-hop headers are dropped (RFC 9110 §7.6.1); end-to-end ones stay, in order."""

from __future__ import annotations

from proxy.core.http.headers import HOP_BY_HOP, end_to_end


def test_hop_by_hop_and_connection_named_fields_are_dropped_in_any_case() -> None:
    headers = [
        ("Content-Type", "text/event-stream"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("x-secret-hop", "1"),
        ("Transfer-Encoding", "chunked"),
        ("Set-Cookie", "a=1"),
        ("KEEP-ALIVE", "timeout=5"),
        ("Set-Cookie", "b=2"),
    ]
    assert end_to_end(headers) == [
        ("Content-Type", "text/event-stream"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
    ]


def test_drop_removes_named_fields_too() -> None:
    assert end_to_end([("Host", "x"), ("Accept", "*/*")], drop=("host",)) == [("Accept", "*/*")]


def test_every_hop_by_hop_field_is_dropped() -> None:
    assert end_to_end([(name.title(), "v") for name in HOP_BY_HOP]) == []
