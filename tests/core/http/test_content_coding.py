"""Accept-Encoding negotiation (RFC 9110 §12.5.3): the smallest acceptable coding on the
measured curve for the flush schedule, the spec's order (§5) only on ties, dictionary zstd only
for declared Codec clients."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import NotAcceptable
from proxy.core.http import content_coding
from proxy.core.http.coding_sizes import BYTES_PER_TOKEN, FLUSH_INTERVALS_MS
from proxy.core.http.content_coding import (
    MEASURED_CURVE,
    SERVER_PREFERENCE,
    CodingCurve,
    ContentCoding,
    codec_accept_encoding,
    coding_label,
    may_send_zstd,
    negotiate_coding,
    negotiate_json_coding,
    parse_accept_encoding,
    weight,
)
from proxy.core.http.versioning import ClientVersion, parse_client_version
from proxy.settings import Settings

CODEC_CLIENT = ClientVersion(0, 4)
# Every coding the same size: the choice is the spec's order, which isolates RFC 9110 parsing.
FLAT = CodingCurve((0.0,), {"msgpack": {coding: (1.0,) for coding in SERVER_PREFERENCE}}, 50.0)
# dict-zstd far the smallest: whenever it is not chosen, the precondition withheld it.
ZSTD_SMALLEST = CodingCurve(
    (0.0,), {"msgpack": {"zstd": (1.0,), "br": (5.0,), "gzip": (6.0,), "identity": (9.0,)}}, 50.0
)
DEFAULTS = Settings(upstream=("http://unused",), tokenizer=Path())


def negotiate(
    header: str | None,
    *,
    curve: CodingCurve = FLAT,
    stream_format: str = "msgpack",
    flush_interval_ms: float = 50.0,
    flush_frames: int = 32,
    zstd_dictionary: bool = True,
    codec_client: ClientVersion | None = CODEC_CLIENT,
    uncompressed: bool = False,
) -> ContentCoding:
    return negotiate_coding(
        header,
        stream_format=stream_format,
        flush_interval_ms=flush_interval_ms,
        flush_frames=flush_frames,
        zstd_dictionary=zstd_dictionary,
        codec_client=codec_client,
        uncompressed=uncompressed,
        curve=curve,
    )


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, "identity"),  # no field: no preference; Codec compression is opt-in
        ("", "identity"),  # empty field: no coding wanted
        ("gzip", "gzip"),
        ("gzip, br", "br"),  # server order on a tie, not the client's
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
def test_accept_encoding_on_a_flat_curve(header: str | None, expected: str) -> None:
    assert negotiate(header) == expected


# --- the measured curve ---------------------------------------------------------------------

OFFERS = ["gzip", "br", "zstd", "deflate"]
# Every subset of codings offered, with identity allowed or excluded.
HEADERS = [
    ", ".join([*offer, *exclusion]) or "identity"
    for n in range(len(OFFERS) + 1)
    for offer in itertools.combinations(OFFERS, n)
    for exclusion in ([], ["identity;q=0"])
    if offer or not exclusion
]
# Every measured interval, between two of them, and beyond the last.
WINDOWS = sorted({*FLUSH_INTERVALS_MS, 5.0, 37.5, 175.0, 1000.0})


@pytest.mark.parametrize("stream_format", sorted(BYTES_PER_TOKEN))
@pytest.mark.parametrize("interval", WINDOWS)
def test_every_interval_picks_the_smallest_acceptable_coding(
    stream_format: str, interval: float
) -> None:
    dictionary = "zstd" in BYTES_PER_TOKEN[stream_format]
    for header in HEADERS:
        accepted = parse_accept_encoding(header)
        candidates = [c for c in SERVER_PREFERENCE if c != "zstd" or dictionary]
        acceptable = [c for c in candidates if weight(accepted, c) > 0]
        size = {c: MEASURED_CURVE.at(stream_format, c, interval) for c in acceptable}
        try:
            chosen = negotiate(
                header,
                curve=MEASURED_CURVE,
                stream_format=stream_format,
                flush_interval_ms=interval,
                flush_frames=10_000,
                zstd_dictionary=dictionary,
            )
        except NotAcceptable:
            assert not acceptable, header  # `deflate, identity;q=0`, say
            continue
        assert chosen in acceptable, header
        assert size[chosen] == min(size.values()), (header, size)


def test_the_curve_is_read_where_it_was_measured_and_between() -> None:
    gzip = BYTES_PER_TOKEN["msgpack"]["gzip"]
    for interval, value in zip(FLUSH_INTERVALS_MS, gzip, strict=True):
        assert MEASURED_CURVE.at("msgpack", "gzip", interval) == value
    middle = (FLUSH_INTERVALS_MS[3] + FLUSH_INTERVALS_MS[4]) / 2
    assert MEASURED_CURVE.at("msgpack", "gzip", middle) == pytest.approx((gzip[3] + gzip[4]) / 2)
    assert MEASURED_CURVE.at("msgpack", "gzip", 10 * FLUSH_INTERVALS_MS[-1]) == gzip[-1]
    # Not measured: never chosen over a measured coding.
    assert MEASURED_CURVE.at("msgpack-delta", "zstd", 50.0) == float("inf")
    assert MEASURED_CURVE.at("protobuf-delta", "gzip", 50.0) == float("inf")  # sent as protobuf


@pytest.mark.parametrize(
    ("interval_ms", "max_frames", "window_ms"),
    [
        (50.0, 32, 50.0),  # the defaults: the interval bounds the window
        (0.0, 32, 0.0),  # 0: every frame
        (50.0, 0, 0.0),  # 0 frames: every frame
        (50.0, 1, 0.0),  # one pending frame is flushed at once
        (60_000.0, 2, 20.0),  # two frames at 50 tokens/s: one gap of 20 ms
    ],
)
def test_the_flush_schedule_as_a_window(
    interval_ms: float, max_frames: int, window_ms: float
) -> None:
    assert MEASURED_CURVE.window_ms(interval_ms, max_frames) == window_ms


def test_the_schedule_decides() -> None:
    # Every frame flushed: zstd's per-block headers cost more than batching saves.
    at = MEASURED_CURVE.at
    assert at("msgpack", "zstd", 0) > at("msgpack", "identity", 0)
    assert negotiate("zstd", curve=MEASURED_CURVE, flush_interval_ms=0) == "identity"
    assert negotiate("zstd", curve=MEASURED_CURVE, flush_interval_ms=250) == "zstd"
    # `identity;q=0` insists on compression, whatever the curve says.
    assert negotiate("zstd, identity;q=0", curve=MEASURED_CURVE, flush_interval_ms=0) == "zstd"


@pytest.mark.parametrize("codec_client", [None, CODEC_CLIENT])
@pytest.mark.parametrize(
    ("stream_format", "target"), [("msgpack", 3.6), ("protobuf", 3.2)]
)  # fmt: skip
def test_a_client_offering_everything_meets_the_target_at_the_defaults(
    stream_format: str, target: float, codec_client: ClientVersion | None
) -> None:
    # httpx's default offer; docs/COMPRESSION.md: 2,048 natural-text tokens at 50 tokens/s.
    chosen = negotiate(
        "gzip, deflate, br, zstd",
        curve=MEASURED_CURVE,
        stream_format=stream_format,
        flush_interval_ms=DEFAULTS.flush_interval_ms,
        flush_frames=DEFAULTS.flush_frames,
        codec_client=codec_client,
    )
    window = MEASURED_CURVE.window_ms(DEFAULTS.flush_interval_ms, DEFAULTS.flush_frames)
    assert MEASURED_CURVE.at(stream_format, chosen, window) <= target


# --- dictionary zstd ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "gets_zstd"),
    [
        (None, False),  # a generic client (httpx, curl, a browser): zstd means RFC 8878
        ("0.0", False),
        ("0.1", False),
        ("garbage", False),  # stated, as 0.0
        ("0.2", True),  # the floor of Codec-Zstd-Dict (codec-spec.md §4)
        ("v0.3", True),
        ("0.4", True),
    ],
)
def test_zstd_only_for_declared_codec_clients_at_0_2(header: str | None, gets_zstd: bool) -> None:
    declared = parse_client_version(header).declared
    chosen = negotiate("zstd, br, gzip", curve=ZSTD_SMALLEST, codec_client=declared)
    assert (chosen == "zstd") is gets_zstd
    assert chosen == ("zstd" if gets_zstd else "br")
    assert may_send_zstd(zstd_dictionary=True, codec_client=declared) is gets_zstd


def test_zstd_needs_a_dictionary_for_the_format() -> None:
    assert negotiate("zstd, gzip", curve=ZSTD_SMALLEST, zstd_dictionary=False) == "gzip"
    assert negotiate("zstd", curve=ZSTD_SMALLEST, zstd_dictionary=False) == "identity"
    assert not may_send_zstd(zstd_dictionary=False, codec_client=CODEC_CLIENT)


@pytest.mark.parametrize(
    "header", ["identity;q=0", "*;q=0", "deflate, identity;q=0", "zstd, identity;q=0"]
)
def test_nothing_acceptable_is_406(header: str) -> None:
    with pytest.raises(NotAcceptable) as caught:
        negotiate(header, zstd_dictionary=False)
    assert caught.value.status_hint == 406
    assert header in caught.value.message


@pytest.mark.parametrize("header", ["zstd, br, gzip", "gzip;q=1, identity;q=0.1", "*"])
def test_a_response_left_uncompressed_is_identity_whatever_is_offered(header: str) -> None:
    assert negotiate(header, curve=ZSTD_SMALLEST, uncompressed=True) == "identity"
    assert negotiate(header, curve=ZSTD_SMALLEST) != "identity"
    with pytest.raises(NotAcceptable):
        negotiate("gzip, identity;q=0", uncompressed=True)


def test_zstd_withheld_from_a_generic_client_can_leave_nothing_acceptable() -> None:
    with pytest.raises(NotAcceptable):
        negotiate("zstd, identity;q=0", codec_client=None)


def test_parse_keeps_wildcard_and_folds_aliases() -> None:
    assert parse_accept_encoding("X-GZIP;q=0.5, *;q=0.1, br") == {"gzip": 0.5, "*": 0.1, "br": 1.0}


CODINGS = st.sampled_from(["gzip", "br", "zstd", "identity", "*", "deflate", "x-gzip", "GZip"])
QVALUES = st.sampled_from(["", ";q=0", ";q=1", ";q=0.5", ";q=0.001", ";q=1.000", ";Q=0"])
VERSIONS = st.sampled_from([None, "0.0", "0.1", "0.2", "0.4", "junk"])


@given(
    elements=st.lists(st.tuples(CODINGS, QVALUES), max_size=6),
    zstd_dictionary=st.booleans(),
    version=VERSIONS,
    stream_format=st.sampled_from(sorted(BYTES_PER_TOKEN)),
    interval=st.floats(min_value=0, max_value=1000, allow_nan=False),
    frames=st.integers(min_value=0, max_value=64),
)
def test_choice_is_acceptable_sendable_and_smallest(
    elements: list[tuple[str, str]],
    zstd_dictionary: bool,
    version: str | None,
    stream_format: str,
    interval: float,
    frames: int,
) -> None:
    header = ", ".join(coding + q for coding, q in elements)
    accepted = parse_accept_encoding(header)
    declared = parse_client_version(version).declared
    zstd = zstd_dictionary and declared is not None and declared >= ClientVersion(0, 2)
    acceptable = [c for c in SERVER_PREFERENCE if (c != "zstd" or zstd) and weight(accepted, c) > 0]
    try:
        chosen = negotiate(
            header,
            curve=MEASURED_CURVE,
            stream_format=stream_format,
            flush_interval_ms=interval,
            flush_frames=frames,
            zstd_dictionary=zstd_dictionary,
            codec_client=declared,
        )
    except NotAcceptable:
        assert not acceptable
        return
    assert chosen in acceptable  # q=0 respected; zstd only when it may be sent
    window = MEASURED_CURVE.window_ms(interval, frames)
    sizes = [MEASURED_CURVE.at(stream_format, c, window) for c in acceptable]
    assert MEASURED_CURVE.at(stream_format, chosen, window) == min(sizes)


@pytest.mark.parametrize(
    ("header", "label"),
    [(None, "identity"), ("gzip", "gzip"), ("X-GZIP", "gzip"), (" br ", "br"),
     ("zstd", "zstd"), ("deflate", "other"), ("made-up-coding-123", "other")],
)  # fmt: skip
def test_coding_label_is_bounded(header: str | None, label: str) -> None:
    assert coding_label(header) == label


# --- JSON responses (json_compression) ------------------------------------------------------

JSON_FLAT = CodingCurve((0.0,), {"json": {coding: (1.0,) for coding in SERVER_PREFERENCE}}, 50.0)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, "identity"),
        ("", "identity"),
        ("gzip, deflate", "gzip"),  # the OpenAI SDK's, on a plain install
        ("zstd", "zstd"),  # plain zstd: no dictionary, no Codec-Client-Version needed
        ("gzip, br, zstd", "zstd"),  # a tie on the curve goes by the spec's order
        ("deflate", "identity"),
        # Never refused: JSON went out whatever a client accepted before compression existed.
        ("identity;q=0", "identity"),
        ("*;q=0", "identity"),
        ("deflate, identity;q=0", "identity"),
        ("br;q=0, *", "zstd"),
    ],
)
def test_json_accept_encoding_on_a_flat_curve(header: str | None, expected: str) -> None:
    assert negotiate_json_coding(header, window_ms=50.0, curve=JSON_FLAT) == expected


def test_json_is_measured_and_compressed_json_is_far_smaller() -> None:
    at = MEASURED_CURVE.at
    for window in (0.0, 50.0, float("inf")):
        for coding in ("gzip", "br", "zstd"):
            assert at("json", coding, window) < at("json", "identity", window) / 10


def test_a_json_stream_and_a_whole_json_body_read_the_curve_at_their_windows() -> None:
    window = MEASURED_CURVE.window_ms(DEFAULTS.flush_interval_ms, DEFAULTS.flush_frames)
    streamed = negotiate_json_coding("gzip, deflate, br, zstd", window_ms=window)
    whole = negotiate_json_coding("gzip, deflate, br, zstd", window_ms=float("inf"))
    at = MEASURED_CURVE.at
    assert at("json", streamed, window) == min(at("json", c, window) for c in SERVER_PREFERENCE)
    assert at("json", whole, 1e9) == min(at("json", c, 1e9) for c in SERVER_PREFERENCE)


@given(
    elements=st.lists(st.tuples(CODINGS, QVALUES), max_size=6),
    window=st.floats(min_value=0, allow_nan=False) | st.just(float("inf")),
)
def test_json_choice_is_acceptable_and_smallest_or_identity(
    elements: list[tuple[str, str]], window: float
) -> None:
    header = ", ".join(coding + q for coding, q in elements)
    accepted = parse_accept_encoding(header)
    acceptable = [c for c in SERVER_PREFERENCE if weight(accepted, c) > 0]
    chosen = negotiate_json_coding(header, window_ms=window)
    if not acceptable:
        assert chosen == "identity"
        return
    assert chosen in acceptable
    sizes = [MEASURED_CURVE.at("json", c, window) for c in acceptable]
    assert MEASURED_CURVE.at("json", chosen, window) == min(sizes)


@pytest.mark.parametrize("zstd", [True, False])
def test_a_codec_client_offers_what_it_decodes_and_zstd_only_with_its_dictionary(
    zstd: bool,
) -> None:
    offered = codec_accept_encoding(zstd=zstd)
    assert offered == ("zstd, br, gzip" if zstd else "br, gzip")
    # What codec-proxy picks from the offer is one of them, and dictionary zstd only when both
    # the offer and the server allow it.
    picked = negotiate_coding(
        offered,
        stream_format="protobuf",
        flush_interval_ms=50,
        flush_frames=32,
        zstd_dictionary=True,
        codec_client=ClientVersion(0, 5),
    )
    assert picked in parse_accept_encoding(offered)
    if not zstd:
        assert picked != "zstd"


def test_an_accept_encoding_field_is_parsed_once_for_every_request_that_sends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[str] = []

    def counted(value: str) -> dict[str, float]:
        parsed.append(value)
        return parse_accept_encoding(value)

    monkeypatch.setattr(content_coding, "parse_accept_encoding", counted)
    field = "br;q=0.9, gzip;q=0.8, x-once-per-field"  # in no other test: not parsed yet
    picks = {
        negotiate_coding(
            field,
            stream_format="msgpack",
            flush_interval_ms=50.0,
            flush_frames=0,
            zstd_dictionary=False,
            codec_client=None,
        )
        for _ in range(3)
    }
    picks.add(negotiate_json_coding(field, window_ms=50.0))
    assert parsed == [field]
    assert picks <= {"br", "gzip"}
    with pytest.raises(TypeError):
        content_coding._accepted(field)["gzip"] = 1.0  # type: ignore[index]  # shared: read-only
