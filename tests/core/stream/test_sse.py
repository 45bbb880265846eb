"""SSEDecoder: the WHATWG event-stream algorithm, chunking independence, limits, real captures."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import EventTooLarge, UpstreamProtocolError
from proxy.core.stream.sse import EventEnds, SSEDecoder, SSEEvent
from tests.core.conftest import capture_names, is_event_stream, read_capture


def decode(chunks: Iterable[bytes], max_event_bytes: int = 1 << 20) -> tuple[list[SSEEvent], bool]:
    """Feed every chunk, then flush; return the events and `incomplete`."""
    decoder = SSEDecoder(max_event_bytes)
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.flush()
    return events, decoder.incomplete


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# --- The algorithm, line by line ------------------------------------------------------------


def test_single_data_line_event() -> None:
    assert decode([b"data: hello\n\n"]) == ([SSEEvent("hello", "message", None)], False)


def test_data_lines_are_joined_with_lf() -> None:
    events, _ = decode([b"data: a\ndata: b\ndata: c\n\n"])
    assert events == [SSEEvent("a\nb\nc")]


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_every_line_ending(eol: bytes) -> None:
    stream = b"data: a" + eol + b"data: b" + eol + eol + b"event: e" + eol + b"data: c" + eol + eol
    assert decode([stream])[0] == [SSEEvent("a\nb"), SSEEvent("c", "e")]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    # Were the LF read as a second line end, the empty line would dispatch "a" on its own.
    events, _ = decode([b"data: a\r", b"\ndata: b\r\n", b"\r\n"])
    assert events == [SSEEvent("a\nb")]


def test_cr_ending_a_chunk_dispatches_without_waiting_for_the_next() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\r") == [SSEEvent("a")]
    assert decoder.feed(b"\ndata: b\n\n") == [SSEEvent("b")]  # LF closed the CRLF, no event


def test_lf_after_cr_is_skipped_only_once() -> None:
    events, _ = decode([b"data: a\r", b"", b"\n", b"\n"])
    assert events == [SSEEvent("a")]


def test_comments_and_retry_and_unknown_fields_are_ignored() -> None:
    stream = b": ping\nretry: 3000\ndata: x\nfoo: bar\nData: no\n:\n\n"
    assert decode([stream]) == ([SSEEvent("x")], False)


def test_field_without_colon_has_empty_value() -> None:
    assert decode([b"data\n\n"])[0] == [SSEEvent("")]
    assert decode([b"data\ndata\n\n"])[0] == [SSEEvent("\n")]
    assert decode([b"event\ndata: x\n\n"])[0] == [SSEEvent("x", "message")]


def test_exactly_one_space_after_the_colon_is_stripped() -> None:
    events, _ = decode([b"data:  two spaces\n\ndata:none\n\ndata:\tTab\n\n"])
    assert [e.data for e in events] == [" two spaces", "none", "\tTab"]


def test_event_type_applies_to_one_event_only() -> None:
    events, _ = decode([b"event: add\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n"])
    assert [(e.event, e.data) for e in events] == [("add", "1"), ("message", "2"), ("message", "3")]


def test_last_event_id_persists_and_ignores_nul() -> None:
    stream = b"id: 7\ndata: a\n\ndata: b\n\nid: x\x00y\ndata: c\n\nid\ndata: d\n\n"
    events, _ = decode([stream])
    assert [e.id for e in events] == ["7", "7", "7", ""]


def test_event_without_data_is_not_dispatched_but_sets_the_id() -> None:
    events, _ = decode([b"event: ping\nid: 9\n\n\n\ndata: later\n\n"])
    assert events == [SSEEvent("later", "message", "9")]


def test_bom_is_stripped_at_stream_start_even_when_split() -> None:
    chunks = [b"\xef", b"\xbb", b"\xbfdata: x\n\n"]
    assert decode(chunks)[0] == [SSEEvent("x")]


def test_bom_elsewhere_is_part_of_the_field_name() -> None:
    events, _ = decode([b"data: a\n\n\xef\xbb\xbfdata: b\n\n"])
    assert events == [SSEEvent("a")]


def test_only_one_bom_is_stripped() -> None:
    assert decode([b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n"])[0] == []


def test_invalid_utf8_becomes_replacement_characters() -> None:
    events, _ = decode([b"data: \xff ok \xe2\x82\n\n"])
    assert events == [SSEEvent("\ufffd ok \ufffd")]


def test_multibyte_character_split_across_chunks() -> None:
    encoded = "data: h\u00e9llo \U0001f600\n\n".encode()
    assert decode(byte_by_byte(encoded))[0] == [SSEEvent("h\u00e9llo \U0001f600")]


# --- End of stream --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stream",
    [b"data: x\n", b"data: x", b"data: x\n\ndata: y", b"event: e\n", b"\xef\xbb"],
)
def test_unterminated_event_is_discarded_and_reported(stream: bytes) -> None:
    decoder = SSEDecoder()
    events = decoder.feed(stream)
    assert decoder.incomplete
    assert decoder.flush() == []
    assert decoder.incomplete
    assert all(e.data == "x" for e in events)


@pytest.mark.parametrize("stream", [b"", b"data: x\n\n", b"data: x\n\n: bye\n", b"\n\n"])
def test_cleanly_ended_stream_is_not_incomplete(stream: bytes) -> None:
    assert decode([stream])[1] is False


def test_flush_starts_a_new_stream() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"id: 1\ndata: lost")
    decoder.flush()
    discarded = decoder.incomplete
    events = decoder.feed(b"\xef\xbb\xbfdata: new\n\n")
    pending = decoder.incomplete
    decoder.flush()
    assert (discarded, events, pending, decoder.incomplete) == (
        True,
        [SSEEvent("new", "message", "1")],
        False,
        False,
    )


# --- Size limit -----------------------------------------------------------------------------


def test_event_too_large_is_an_upstream_protocol_error() -> None:
    with pytest.raises(EventTooLarge) as info:
        decode([b"data: " + b"x" * 100 + b"\n\n"], max_event_bytes=50)
    assert isinstance(info.value, UpstreamProtocolError)
    assert info.value.status_hint == 502


def bytes_fed_until_too_large(decoder: SSEDecoder, chunk: bytes) -> int:
    fed = 0
    while fed < 1 << 30:
        fed += len(chunk)
        try:
            decoder.feed(chunk)
        except EventTooLarge:
            return fed
    raise AssertionError("never raised")


def test_line_without_terminator_cannot_grow_past_the_limit() -> None:
    # Raised by the chunk that crosses the limit: nothing is buffered past it.
    decoder = SSEDecoder(max_event_bytes=10 * 1024)
    assert bytes_fed_until_too_large(decoder, b"x" * 1024) == 11 * 1024


def test_limit_counts_all_lines_of_one_event() -> None:
    line = b"data: " + b"x" * 34 + b"\n"  # 40 bytes without the LF
    assert len(decode([line * 2 + b"\n"] * 3, max_event_bytes=80)[0]) == 3
    with pytest.raises(EventTooLarge):
        decode([line * 3 + b"\n"], max_event_bytes=80)


def test_comment_lines_are_bounded_but_not_accumulated() -> None:
    comment = b":" + b"c" * 39 + b"\n"
    assert decode([comment * 10 + b"data: ok\n\n"], max_event_bytes=50)[0] == [SSEEvent("ok")]
    with pytest.raises(EventTooLarge):
        decode([b":" + b"c" * 60 + b"\n"], max_event_bytes=50)


def test_a_bom_split_across_chunks_is_not_counted_as_event_bytes() -> None:
    assert decode([b"\xef\xbb", b"\xbf", b"data:x\n\n"], max_event_bytes=6) == (
        [SSEEvent("x")],
        False,
    )


def test_max_event_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        SSEDecoder(0)


# --- Real upstream captures -----------------------------------------------------------------

SSE_CAPTURES = [name for name in capture_names() if is_event_stream(read_capture(name))]
JSON_CAPTURES = [name for name in capture_names() if name not in SSE_CAPTURES]


def naive_event_data(body: bytes) -> list[str]:
    """An independent oracle valid for these captures only: LF-only, one `data: ` line each."""
    blocks = body.split(b"\n\n")
    assert blocks[-1] == b""
    assert all(block.startswith(b"data: ") and b"\n" not in block for block in blocks[:-1])
    return [block[len(b"data: ") :].decode() for block in blocks[:-1]]


def test_captures_are_classified() -> None:
    assert len(SSE_CAPTURES) == 17
    assert JSON_CAPTURES == [
        "llamacpp-error-bad-json.txt",
        "llamacpp-error-embeddings-501.txt",
        "llamacpp-error-tools-500.txt",
        "llamacpp-models.txt",
        "llamacpp-tokenize.txt",
        "vllm-completions-error-n2-binary.txt",
        "vllm-tokenize.txt",
    ]


@pytest.mark.parametrize("name", SSE_CAPTURES)
def test_capture_decodes_to_its_events(name: str) -> None:
    body = read_capture(name).body
    events, incomplete = decode([body])
    assert [e.data for e in events] == naive_event_data(body)
    assert {(e.event, e.id) for e in events} == {("message", None)}
    assert events[-1].data == "[DONE]"
    assert not incomplete


@pytest.mark.parametrize("name", JSON_CAPTURES)
def test_json_body_is_no_event_stream(name: str) -> None:
    # An error answer read as SSE: one unterminated line, no event, reported as incomplete.
    assert decode([read_capture(name).body]) == ([], True)


@pytest.mark.parametrize("name", SSE_CAPTURES)
def test_capture_byte_by_byte(name: str) -> None:
    body = read_capture(name).body
    assert decode(byte_by_byte(body)) == decode([body])


@pytest.mark.parametrize("name", SSE_CAPTURES)
def test_capture_split_at_every_offset(name: str) -> None:
    body = read_capture(name).body
    expected = decode([body])
    for offset in range(len(body) + 1):
        assert decode([body[:offset], body[offset:]]) == expected, offset


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_capture_with_other_line_endings_split_at_every_offset(eol: bytes) -> None:
    lf_body = read_capture("vllm-completions-stop-sequence.txt").body
    body = lf_body.replace(b"\n", eol)
    expected = decode([lf_body])
    for offset in range(len(body) + 1):
        assert decode([body[:offset], body[offset:]]) == expected, offset
    assert decode(byte_by_byte(body)) == expected


# --- Properties -----------------------------------------------------------------------------

# Field values: any text without CR/LF (and without lone surrogates, which UTF-8 cannot carry).
values = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), max_size=12)
Line = tuple[str, str]  # (kind, value)
lines = st.one_of(
    st.tuples(st.just("data"), values),
    st.tuples(st.just("event"), values),
    st.tuples(st.just("id"), values | st.just("a\x00b")),
    st.tuples(st.just("comment"), values),
    st.tuples(st.just("retry"), st.from_regex(r"[0-9]{0,5}", fullmatch=True)),
    st.tuples(st.sampled_from(["foo", "Data", "DATA", "ids", "events"]), values),
)
events_strategy = st.lists(st.lists(lines, max_size=5), max_size=6)


def expected_events(events: list[list[Line]]) -> list[SSEEvent]:
    """The spec's dispatch rules, written as directly as possible."""
    out = []
    last_id: str | None = None
    for event in events:
        data = [value for kind, value in event if kind == "data"]
        event_type = ""
        for kind, value in event:
            if kind == "event":
                event_type = value
            elif kind == "id" and "\x00" not in value:
                last_id = value
        if data:
            out.append(SSEEvent("\n".join(data), event_type or "message", last_id))
    return out


@st.composite
def rendered_line(draw: st.DrawFn, line: Line) -> str:
    kind, value = line
    if kind == "comment":
        return ":" + value
    if value == "" and draw(st.booleans()):
        return kind  # field name without a colon
    # A value starting with a space needs the one space that the parser strips.
    space = " " if value.startswith(" ") or draw(st.booleans()) else ""
    return f"{kind}:{space}{value}"


@st.composite
def serialized_streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent], bool]:
    """A stream of random events with random line ends, plus what a decoder must return."""
    events = draw(events_strategy)
    trailing = draw(st.lists(lines, max_size=3))
    text_lines: list[str] = []
    for event in events:
        text_lines += [draw(rendered_line(line)) for line in event]
        text_lines.append("")
    text_lines += [draw(rendered_line(line)) for line in trailing]
    last_terminated = draw(st.booleans()) if trailing else True

    out = "\ufeff" if draw(st.booleans()) else ""
    previous_eol = ""
    for index, line in enumerate(text_lines):
        eol = draw(st.sampled_from(["\n", "\r", "\r\n"]))
        if previous_eol == "\r" and line == "" and eol == "\n":
            eol = "\r\n"  # CR then LF would be one CRLF, not two line ends
        if index == len(text_lines) - 1 and not last_terminated:
            eol = ""
        out += line + eol
        previous_eol = eol
    incomplete = bool(trailing) and (
        not last_terminated or any(kind != "comment" for kind, _ in trailing)
    )
    return out.encode(), expected_events(events), incomplete


@st.composite
def chunkings(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@given(st.data(), serialized_streams())
def test_any_stream_any_chunking(
    data: st.DataObject, stream: tuple[bytes, list[SSEEvent], bool]
) -> None:
    body, expected, incomplete = stream
    chunks = data.draw(chunkings(body))
    assert decode(chunks) == (expected, incomplete)


@given(st.data(), serialized_streams(), st.integers(1, 120))
def test_size_limit_does_not_depend_on_chunking(
    data: st.DataObject, stream: tuple[bytes, list[SSEEvent], bool], limit: int
) -> None:
    body, expected, _ = stream

    def run(chunks: list[bytes]) -> tuple[list[SSEEvent], bool]:
        decoder = SSEDecoder(limit)
        out: list[SSEEvent] = []
        try:
            for chunk in chunks:
                out += decoder.feed(chunk)
        except EventTooLarge:
            return out, True
        return out, False

    whole, whole_raised = run([body])
    split, split_raised = run(data.draw(chunkings(body)))
    assert whole_raised == split_raised
    if not whole_raised:
        assert whole == split == expected
    assert expected[: len(whole)] == whole
    assert expected[: len(split)] == split


@given(st.binary(max_size=300), st.data())
def test_arbitrary_bytes_never_raise_anything_but_event_too_large(
    body: bytes, data: st.DataObject
) -> None:
    with contextlib.suppress(EventTooLarge):
        decode(data.draw(chunkings(body)), max_event_bytes=data.draw(st.integers(1, 400)))


# --- EventEnds: where events end, for cutting a stream that is passed on ----------------------


def blank_line_ends(body: bytes) -> list[int]:
    """An independent oracle, byte by byte over the whole stream: the offsets just past every
    line end that ends an empty line."""
    ends = []
    empty = True  # the stream starts a line
    i = 0
    while i < len(body):
        if body[i] in b"\r\n":
            i += 2 if body[i : i + 2] == b"\r\n" else 1
            if empty:
                ends.append(i)
            empty = True
        else:
            empty = False
            i += 1
    return ends


def cuts(chunks: list[bytes]) -> tuple[int, list[int]]:
    """(events counted, the stream offset each chunk that ended events was cut at)."""
    ends = EventEnds()
    total = offset = 0
    at: list[int] = []
    for chunk in chunks:
        events, end = ends.feed(chunk)
        assert 0 <= end <= len(chunk)
        assert (events == 0) == (end == 0)
        if events:
            at.append(offset + end)
        total += events
        offset += len(chunk)
    return total, at


def check_cuts(
    body: bytes, chunks: list[bytes], oracle: list[int] | None = None, *, decode: bool = True
) -> None:
    """`chunks` (of `body`) are cut where `oracle` (`blank_line_ends(body)`) says; with
    `decode`, a client holding the stream up to each cut has no event half read."""
    oracle = blank_line_ends(body) if oracle is None else oracle
    total, at = cuts(chunks)
    assert total == len(oracle)
    offset = 0
    bounds = []
    for chunk in chunks:
        offset += len(chunk)
        bounds.append(offset)
    for cut in at:
        # The last event end in its chunk, or a blank line's CRLF split after its CR: the
        # event ends at the CR, the end of the chunk.
        chunk_end = next(b for b in bounds if b >= cut)
        last = max((e for e in oracle if e <= chunk_end), default=None)
        if cut != last:
            assert cut == chunk_end, cut
            assert body[cut - 1 : cut + 1] == b"\r\n", cut
            assert cut + 1 in oracle, cut
        if decode:
            decoder = SSEDecoder()
            decoder.feed(body[:cut])
            assert not decoder.incomplete, cut


@pytest.mark.parametrize("name", SSE_CAPTURES)
def test_event_ends_of_a_capture_split_at_every_offset(name: str) -> None:
    body = read_capture(name).body
    oracle = blank_line_ends(body)
    assert cuts([body]) == (body.count(b"\n\n"), [len(body)])
    assert len(oracle) == body.count(b"\n\n")
    check_cuts(body, [body])
    for offset in range(len(body) + 1):
        check_cuts(body, [body[:offset], body[offset:]], oracle, decode=False)


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_event_ends_with_other_line_endings_split_at_every_offset(eol: bytes) -> None:
    body = read_capture("vllm-completions-stop-sequence.txt").body.replace(b"\n", eol)
    oracle = blank_line_ends(body)
    for offset in range(len(body) + 1):
        check_cuts(body, [body[:offset], body[offset:]], oracle, decode=False)
    check_cuts(body, byte_by_byte(body))


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b"data: a\r\n\r", b"\ndata: b\r\n\r\n"], (2, [10, 22])),  # the LF after a CR skipped
        ([b"data: a\r\n", b"\r\n"], (1, [11])),  # the blank line opens the chunk
        ([b"data: a\n", b"\n"], (1, [9])),
        ([b"\n\n\n"], (3, [3])),  # every blank line is a point with nothing half read
        ([b"data: a\n\ndata: b"], (1, [9])),  # what follows the last end waits
        ([b"data: a\r", b"\r"], (1, [9])),
        ([b"", b"\n"], (1, [1])),
    ],
)
def test_event_ends_traps(chunks: list[bytes], expected: tuple[int, list[int]]) -> None:
    assert cuts(chunks) == expected
    check_cuts(b"".join(chunks), chunks)


@given(st.data(), serialized_streams())
def test_event_ends_of_any_stream_any_chunking(
    data: st.DataObject, stream: tuple[bytes, list[SSEEvent], bool]
) -> None:
    body = stream[0]
    check_cuts(body, data.draw(chunkings(body)))


@given(st.data(), st.lists(st.sampled_from([b"data: x", b"\r", b"\n", b"\r\n", b": c"])))
def test_event_ends_of_any_line_ending_soup(data: st.DataObject, pieces: list[bytes]) -> None:
    body = b"".join(pieces)
    check_cuts(body, data.draw(chunkings(body)))
