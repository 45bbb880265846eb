"""How messages show values the proxy did not choose: bounded, quoted, without credentials."""

from __future__ import annotations

import pytest

from proxy.core.shown import SHOWN_CHARS, clipped, quoted, without_credentials

HUGE = "m" * (4 << 20)


def test_a_short_value_is_its_repr() -> None:
    assert quoted("llama3") == "'llama3'"
    assert quoted(b"br") == "b'br'"
    assert clipped("Not Found") == "Not Found"


def test_a_huge_value_is_cut_and_says_how_long_it_was() -> None:
    shown = quoted(HUGE)
    assert shown == f"{'m' * SHOWN_CHARS!r}... ({len(HUGE)} characters)"
    assert quoted(HUGE.encode()).endswith(f"... ({len(HUGE)} bytes)")
    assert clipped(HUGE) == f"{'m' * SHOWN_CHARS}... ({len(HUGE)} characters)"
    assert quoted("x" * SHOWN_CHARS) == repr("x" * SHOWN_CHARS)  # at the limit: whole


def test_control_characters_are_escaped_even_in_the_cut_part() -> None:
    forged = "/v1/x\n2026-01-01 00:00:00,000 INFO codec_proxy: forged\r\x1b[2J" * 50
    for shown in (quoted(forged), quoted(forged[:20])):
        assert not any(ord(c) < 0x20 for c in shown)
        assert "\\n" in shown


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://alice:s3cret@vllm:8000", "http://***@vllm:8000"),
        ("https://token@host/v1?x=1", "https://***@host/v1?x=1"),
        # A password with an unescaped "@": all of the userinfo goes, up to the last one.
        ("http://alice:p@ss@vllm:8000/x", "http://***@vllm:8000/x"),
        # Every URL of a text, reprs and messages alike; only the userinfo changes.
        (
            "upstream unreachable (http://a:b@h1:1: down; http://h2:2: ok)",
            "upstream unreachable (http://***@h1:1: down; http://h2:2: ok)",
        ),
        ("('http://a:b@h1', 'http://c:d@h2')", "('http://***@h1', 'http://***@h2')"),
        # An "@" after the authority, or outside any URL, is no credential.
        ("http://vllm:8000/users/@me", "http://vllm:8000/users/@me"),
        ("http://vllm:8000?to=a@b", "http://vllm:8000?to=a@b"),
        ("mail ops@example.com", "mail ops@example.com"),
        # JSON text: a match never runs from one string into the next one.
        ('{"u":"http://h:1","x":"a@b"}', '{"u":"http://h:1","x":"a@b"}'),
    ],
)
def test_without_credentials(text: str, expected: str) -> None:
    assert without_credentials(text) == expected
