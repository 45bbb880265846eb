"""Codec-Client-Version parsing and the floor tables (codec-spec.md §4, §6, §12 items 25-26)."""

from __future__ import annotations

import pytest

from proxy.core.http.versioning import (
    HEADER_FLOORS,
    ClientVersion,
    allows_header,
    finish_reason_for,
    parse_client_version,
    withheld_headers,
)
from proxy.core.wire import finish


@pytest.mark.parametrize(
    ("header", "version", "source"),
    [
        (None, (0, 2), "absent"),
        ("", (0, 2), "absent"),
        ("   ", (0, 2), "absent"),
        ("0.4", (0, 4), "valid"),
        ("v0.4", (0, 4), "valid"),
        ("V0.4", (0, 4), "valid"),
        ("0.4.1", (0, 4), "valid"),
        ("v0.3.9", (0, 3), "valid"),
        ("  0.5  ", (0, 5), "valid"),
        ("0.10", (0, 10), "valid"),  # minor 10 is above minor 4, not "0.1"
        ("1.0", (1, 0), "valid"),
        ("0.2", (0, 2), "valid"),
        ("garbage", (0, 0), "unparsable"),
        ("0", (0, 0), "unparsable"),
        ("0.", (0, 0), "unparsable"),
        ("0.x", (0, 0), "unparsable"),
        ("0.4-beta", (0, 0), "unparsable"),
        ("0.4.1.2", (0, 0), "unparsable"),
        ("vv0.4", (0, 0), "unparsable"),
        ("0 .4", (0, 0), "unparsable"),
        ("9" * 40 + ".1", (0, 0), "unparsable"),
    ],
)
def test_version_parsing_table(header: str | None, version: tuple[int, int], source: str) -> None:
    parsed = parse_client_version(header)
    assert (parsed.version.major, parsed.version.minor) == version
    assert parsed.source == source
    assert parsed.unparsable is (source == "unparsable")
    # Only a header says the client is a Codec client at all; an unparsable one still does.
    assert parsed.declared == (None if source == "absent" else parsed.version)


def test_versions_compare_by_major_then_minor() -> None:
    assert ClientVersion(0, 10) > ClientVersion(0, 4) > ClientVersion(0, 3)
    assert ClientVersion(1, 0) > ClientVersion(0, 99)
    assert str(ClientVersion(0, 4)) == "0.4"


HEADERS = [
    "Codec-Zstd-Dict",
    "Codec-Tokenizer-Map",
    "Codec-Latent-Map",
    "Codec-Map",
    "Codec-Safety-Policy",
    "Codec-Safety-Policy-Id",
    "Codec-Safety-Policy-Hash",
    "Codec-Min-Version",
    "Codec-Required-Features",
    "Codec-Server-Version",
    "Codec-Invented-Later",
    "Content-Type",
    "Vary",
]
# What each client may receive, from the spec's graceful-downgrade table (codec-spec.md §6).
EXPECTED = {
    "0.0": {"Codec-Min-Version", "Codec-Required-Features", "Content-Type", "Vary"},
    "0.2": {
        "Codec-Min-Version",
        "Codec-Required-Features",
        "Content-Type",
        "Vary",
        "Codec-Zstd-Dict",
        "Codec-Tokenizer-Map",
    },
}
EXPECTED["0.3"] = EXPECTED["0.2"] | {"Codec-Latent-Map", "Codec-Map"}
EXPECTED["0.4"] = EXPECTED["0.3"] | {
    "Codec-Safety-Policy",
    "Codec-Safety-Policy-Id",
    "Codec-Safety-Policy-Hash",
}
# The I-D's header: it describes version 0.5, so a 0.4 client never sees it.
EXPECTED["0.5"] = EXPECTED["0.4"] | {"Codec-Server-Version"}


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("0.0", "0.0"),
        ("garbage", "0.0"),
        ("0.1", "0.0"),
        ("0.2", "0.2"),
        (None, "0.2"),  # absent
        ("0.3", "0.3"),
        ("v0.4.2", "0.4"),
        ("0.5", "0.5"),
    ],
)
def test_header_floors_per_client(header: str | None, expected: str) -> None:
    client = parse_client_version(header).version
    allowed = {name for name in HEADERS if allows_header(client, name)}
    assert allowed == EXPECTED[expected]
    assert set(withheld_headers(client, HEADERS)) == set(HEADERS) - EXPECTED[expected]


def test_header_names_match_case_insensitively() -> None:
    v03 = ClientVersion(0, 3)
    assert not allows_header(v03, "codec-safety-policy")
    assert not allows_header(v03, "CODEC-SAFETY-POLICY-HASH")
    assert allows_header(v03, "codec-zstd-DICT")
    assert withheld_headers(v03, ["codec-SAFETY-policy", "x-other"]) == ["codec-SAFETY-policy"]


def test_every_floor_is_a_lowercase_codec_header() -> None:
    for name in HEADER_FLOORS:
        assert name == name.lower()
        assert name.startswith("codec-")


def test_policy_violation_only_from_0_4() -> None:
    for version, expected in [
        ((0, 0), finish.ERROR),
        ((0, 2), finish.ERROR),
        ((0, 3), finish.ERROR),
        ((0, 4), finish.POLICY_VIOLATION),
        ((0, 5), finish.POLICY_VIOLATION),
    ]:
        assert finish_reason_for(ClientVersion(*version), finish.POLICY_VIOLATION) == expected
    for reason in (finish.LENGTH, finish.EOS_TOKEN, finish.STOP_SEQUENCE, finish.ERROR):
        assert finish_reason_for(ClientVersion(0, 0), reason) == reason
