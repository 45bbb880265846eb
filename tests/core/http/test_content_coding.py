"""Accept-Encoding negotiation (RFC 9110 §12.5.3) with the spec's server preference (§5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import NotAcceptable
from proxy.core.http.content_coding import (
    SERVER_PREFERENCE,
    coding_label,
    negotiate_coding,
    parse_accept_encoding,
    weight,
)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, "identity"),  # no field: no preference; Codec compression is opt-in
        ("", "identity"),  # empty field: no coding wanted
        ("gzip", "gzip"),
        ("gzip, br", "br"),  # server order, not the client's
        ("gzip;q=1.0, br;q=0.1", "br"),  # q only decides acceptable or not
        ("zstd, br, gzip", "zstd"),
        ("ZSTD, Br", "zstd"),  # case-insensitive
        ("x-gzip", "gzip"),  # RFC 9110 §8.4.1.3
        ("br;q=0, gzip", "gzip"),  # q=0 excludes
        ("br;q=0.000, gzip;q=0.001", "gzip"),
        ("*", "zstd"),
        ("*;q=0.5, zstd;q=0", "br"),  # * covers what is not listed
        ("*;q=0, identity", "identity"),
        ("identity;q=0, gzip", "gzip"),
        ("deflate, compress", "identity"),  # identity stays acceptable unless excluded
        ("gzip;q=2, br", "br"),  # bad qvalue: that element is ignored
        ("gzip;q=abc", "identity"),
        ("gzip ; q=0.5", "gzip"),  # OWS around ';' is allowed
        ("br, br;q=0", "br"),  # listed twice: the higher weight wins
    ],
)
def test_negotiation(header: str | None, expected: str) -> None:
    assert negotiate_coding(header, zstd_dictionary=True) == expected


def test_zstd_needs_a_dictionary_for_the_format() -> None:
    assert negotiate_coding("zstd, gzip", zstd_dictionary=False) == "gzip"
    assert negotiate_coding("zstd", zstd_dictionary=False) == "identity"


def test_zstd_can_be_withheld_from_old_clients() -> None:
    # Clients below Codec 0.2 may not receive Codec-Zstd-Dict, so no zstd (codec-spec.md §4).
    assert negotiate_coding("zstd, br", zstd_dictionary=True, allow_zstd=False) == "br"


@pytest.mark.parametrize(
    "header", ["identity;q=0", "*;q=0", "deflate, identity;q=0", "zstd, identity;q=0"]
)
def test_nothing_acceptable_is_406(header: str) -> None:
    with pytest.raises(NotAcceptable) as caught:
        negotiate_coding(header, zstd_dictionary=False)
    assert caught.value.status_hint == 406
    assert header in caught.value.message


def test_parse_keeps_wildcard_and_folds_aliases() -> None:
    assert parse_accept_encoding("X-GZIP;q=0.5, *;q=0.1, br") == {"gzip": 0.5, "*": 0.1, "br": 1.0}


CODINGS = st.sampled_from(["gzip", "br", "zstd", "identity", "*", "deflate", "x-gzip", "GZip"])
QVALUES = st.sampled_from(["", ";q=0", ";q=1", ";q=0.5", ";q=0.001", ";q=1.000", ";Q=0"])


@given(
    elements=st.lists(st.tuples(CODINGS, QVALUES), max_size=6),
    zstd_dictionary=st.booleans(),
    allow_zstd=st.booleans(),
)
def test_choice_is_acceptable_and_most_preferred(
    elements: list[tuple[str, str]], zstd_dictionary: bool, allow_zstd: bool
) -> None:
    header = ", ".join(coding + q for coding, q in elements)
    accepted = parse_accept_encoding(header)
    available = [c for c in SERVER_PREFERENCE if c != "zstd" or (zstd_dictionary and allow_zstd)]
    acceptable = [c for c in available if weight(accepted, c) > 0]
    try:
        chosen = negotiate_coding(header, zstd_dictionary=zstd_dictionary, allow_zstd=allow_zstd)
    except NotAcceptable:
        assert not acceptable
        return
    assert chosen == acceptable[0]
    assert weight(accepted, chosen) > 0


@pytest.mark.parametrize(
    ("header", "label"),
    [(None, "identity"), ("gzip", "gzip"), ("X-GZIP", "gzip"), (" br ", "br"),
     ("zstd", "zstd"), ("deflate", "other"), ("made-up-coding-123", "other")],
)  # fmt: skip
def test_coding_label_is_bounded(header: str | None, label: str) -> None:
    assert coding_label(header) == label
