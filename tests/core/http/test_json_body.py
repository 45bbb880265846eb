"""The one JSON request-body parser (proxy/core/http/json_body.py): orjson's strictness as 400s,
and a long array of integers counted before it is parsed, in slices, to the same result."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import BadRequest
from proxy.core.http import json_body
from proxy.core.http.json_body import parse_json_object, read_json_object

# Small enough that short test bodies take the sliced path, with slices cut mid-array.
MIN_RUN = 6
SLICE = 5


def read(raw: bytes) -> Any:
    """`read_json_object(...).complete()`, or the BadRequest's code."""
    try:
        return read_json_object(raw, min_run=MIN_RUN, slice_bytes=SLICE).complete()
    except BadRequest as exc:
        return exc.code


def reference(raw: bytes) -> Any:
    """What orjson makes of the whole body at once."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "invalid_json"
    return value if isinstance(value, dict) else "invalid_json"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt": "\\ud800", "stream_format": "msgpack"}',  # a lone high surrogate
        b'{"prompt": "x", "stop": ["\\udc00"]}',  # a lone low surrogate
        b'{"prompt": "\xed\xa0\x80"}',  # a surrogate encoded as UTF-8 (RFC 3629 §3: invalid)
        b'{"a": ' + b"[" * 1025 + b"]" * 1025 + b"}",  # deeper than orjson's 1024 levels
        b"[" * 100_000 + b"]" * 100_000,  # where `json` overflowed the stack
        b'{"a": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001,
        b'{"a": NaN}',
        b"\xef\xbb\xbf{}",  # RFC 8259 §8.1: no byte order mark
    ],
    ids=["high", "low", "utf8-surrogate", "depth-1025", "depth-100000", "objects", "nan", "bom"],
)
def test_what_orjson_refuses_is_invalid_json(raw: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_json_object(raw)
    assert (info.value.status_hint, info.value.code) == (400, "invalid_json")


def test_a_surrogate_pair_is_one_character() -> None:
    assert parse_json_object(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}


def test_a_long_integer_array_is_counted_before_it_is_parsed() -> None:
    # `-04` is no JSON number: counting does not notice, parsing does.
    raw = b'{"stream_format": "msgpack", "prompt": [1, 2, 3, -04, 5, 6, 7]}'
    document = read_json_object(raw, min_run=MIN_RUN, slice_bytes=SLICE)
    assert document.pending is not None
    assert document.pending.key == "prompt"
    assert document.pending.items is document.value["prompt"]
    assert document.pending.count == 7
    with pytest.raises(BadRequest, match="in the array of 'prompt'"):
        document.complete()


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"prompt": [10, 20, 30, 40]}', ("prompt",)),
        (b'{"prompt": [[10, 20, 30, 40]]}', ("prompt", 0)),
        (b'{"prompt": [[10, 20, 30, 40], [1]], "n": 1}', ("prompt", 0)),
        (b'{"a": [1], "b": [10, 20, 30, 40,     50], "c": [1, 2]}', ("b",)),
    ],
)
def test_where_the_array_may_sit(raw: bytes, where: tuple[str | int, ...]) -> None:
    document = read_json_object(raw, min_run=MIN_RUN, slice_bytes=SLICE)
    assert document.pending is not None
    value: Any = document.value
    for step in where:
        value = value[step]
    assert value is document.pending.items
    assert document.complete() == orjson.loads(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt": "[1, 2, 3, 4, 5]"}',  # inside a string: the marker breaks the string
        b'{"prompt": "a\\"[1, 2, 3, 4, 5]\\"b"}',
        b'{"deep": {"prompt": [1, 2, 3, 4, 5]}}',  # not at a top-level key
        b'{"prompt": [0, [1, 2, 3, 4, 5]]}',
        b'{"prompt": [1, 2, 3, 4, 5.5]}',  # a fraction ends the run before the bracket
    ],
)
def test_anywhere_else_the_whole_body_is_parsed_at_once(raw: bytes) -> None:
    assert read_json_object(raw, min_run=MIN_RUN, slice_bytes=SLICE).pending is None
    assert read(raw) == reference(raw)


def test_an_array_body_is_not_an_object() -> None:
    assert read(b"[1, 2, 3, 4, 5, 6, 7]") == "invalid_json"


@pytest.mark.parametrize(
    "run",
    [
        b"1, 2, 3,, 4",
        b"1, 2, 3, 4,",
        b", 1, 2, 3, 4",
        b"1, 2, 3 4, 5",
        b"1, 2, 03, 4",
        b"1, 2, -, 4",
        b"1, 2, --3, 4",
        b"1, 2, 3, 4, -",
        b"      ",
        b" \n\t\r 7 ",
        b"-0, -1, 18446744073709551615, 18446744073709551616, -9223372036854775809",
        b"1" * 400,
    ],
)
def test_malformed_and_odd_runs_read_as_orjson_reads_them(run: bytes) -> None:
    raw = b'{"prompt": [' + run + b'], "x": 1}'
    assert read(raw) == reference(raw)


def test_a_marker_sent_by_the_client_is_just_a_string() -> None:
    raw = b'{"prompt": ["codec-proxy-ids-00"], "other": [1, 2, 3, 4, 5, 6]}'
    assert read(raw) == reference(raw)


def test_the_longest_run_is_the_one_left_pending() -> None:
    raw = b'{"a": [1, 2, 3, 4], "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9], "b": [5, 6, 7, 8]}'
    document = read_json_object(raw, min_run=MIN_RUN, slice_bytes=SLICE)
    assert document.pending is not None
    assert document.pending.key == "prompt"


def test_runs_across_scan_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    # The body is scanned in windows; a run crossing several must still be found whole.
    monkeypatch.setattr(json_body, "WINDOW_BYTES", 7)
    ids = list(range(300))
    raw = orjson.dumps({"n": 1, "prompt": ids, "s": "x" * 20, "stop": [1, 2, 3, 4, 5]})
    document = read_json_object(raw, min_run=MIN_RUN, slice_bytes=SLICE)
    assert document.pending is not None
    assert document.pending.count == 300
    assert document.complete() == orjson.loads(raw)


def test_default_sizes_on_a_real_prompt() -> None:
    ids = [(i * 7919) % 49152 for i in range(200_000)]
    raw = json.dumps({"prompt": ids, "stream_format": "msgpack"}).encode()
    document = read_json_object(raw)
    assert document.pending is not None
    assert document.pending.count == len(ids)
    assert document.complete() == {"prompt": ids, "stream_format": "msgpack"}


# --- properties -------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
integer_lists = st.lists(st.integers(-(2**66), 2**66), max_size=30)


@given(
    st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    st.sampled_from(["prompt", "x", ""]),
    integer_lists,
    st.booleans(),
    st.sampled_from([",", ", ", " , ", ",\n\t"]),
)
def test_same_as_orjson_for_any_object_with_an_integer_array(
    others: dict[str, Any], key: str, ids: list[int], nested: bool, separator: str
) -> None:
    array = "[" + separator.join(str(i) for i in ids) + "]"
    inner = f"[{array}]" if nested else array
    body = dict(others)
    body.pop(key, None)
    text = json.dumps(body)[:-1] + (", " if body else "") + json.dumps(key) + ": " + inner + "}"
    raw = text.encode()
    assert read(raw) == reference(raw)


@given(st.binary(max_size=60), st.data())
def test_same_as_orjson_for_mangled_bodies(noise: bytes, data: st.DataObject) -> None:
    raw = bytearray(b'{"prompt": [1, 22, 333, 4444, 55555, 6], "s": "[7, 8, 9, 10]"}')
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, len(raw)))
        piece = data.draw(st.sampled_from([b",", b" ", b"-", b"0", b"[", b"]", b'"', noise]))
        raw[position:position] = piece
    assert read(bytes(raw)) == reference(bytes(raw))
