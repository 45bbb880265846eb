"""Which JSON responses are compressed, and the headers a compressed one carries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.http.json_coding import coded_headers, compressible_json


def kind(
    status: int = 200,
    content_type: str | None = "application/json",
    content_encoding: str | None = None,
    cache_control: str | None = None,
    request_cache_control: str | None = None,
) -> str | None:
    return compressible_json(
        status=status,
        content_type=content_type,
        content_encoding=content_encoding,
        cache_control=cache_control,
        request_cache_control=request_cache_control,
    )


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("text/event-stream", "events"),
        ("text/event-stream; charset=utf-8", "events"),  # vLLM's
        ("Text/Event-Stream", "events"),
        ("application/json", "whole"),
        ("application/json; charset=utf-8", "whole"),  # llama.cpp's
        ("application/problem+json", "whole"),
        ("application/x-ndjson", None),
        ("text/plain", None),
        ("application/octet-stream", None),
        ("application/x-protobuf", None),
        ("", None),
        (None, None),
    ],
)
def test_json_and_event_streams_only(content_type: str | None, expected: str | None) -> None:
    assert kind(content_type=content_type) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [(200, "whole"), (201, "whole"), (203, "whole"), (204, None), (205, None), (206, None),
     (304, None), (400, None), (404, None), (429, None), (500, None), (503, None), (101, None)],
)  # fmt: skip
def test_successful_responses_with_content_only(status: int, expected: str | None) -> None:
    assert kind(status) == expected


@pytest.mark.parametrize(
    ("content_encoding", "expected"),
    [(None, "whole"), ("identity", "whole"), (" Identity ", "whole"), ("", "whole"),
     ("gzip", None), ("br", None), ("zstd", None), ("gzip, identity", None), ("deflate", None)],
)  # fmt: skip
def test_an_upstream_coding_is_never_coded_again(
    content_encoding: str | None, expected: str | None
) -> None:
    assert kind(content_encoding=content_encoding) == expected


@pytest.mark.parametrize(
    ("cache_control", "expected"),
    [(None, "whole"), ("no-cache", "whole"), ("no-transform", None),
     ("no-cache, No-Transform", None), ("max-age=0,no-transform", None)],
)  # fmt: skip
def test_no_transform_forbids_it(cache_control: str | None, expected: str | None) -> None:
    assert kind(cache_control=cache_control) == expected
    # The client's own, on its request (RFC 9111 §5.2.1.6), whatever the response says.
    assert kind(request_cache_control=cache_control) == expected
    assert kind(cache_control="no-cache", request_cache_control=cache_control) == expected


def names(headers: list[tuple[str, str]]) -> list[str]:
    return [name.lower() for name, _ in headers]


def test_coded_headers() -> None:
    upstream = [
        ("content-type", "text/event-stream; charset=utf-8"),
        ("Content-Length", "123"),
        ("Content-Encoding", "identity"),
        ("ETag", '"abc"'),
        ("Content-Digest", "sha-256=:x:"),
        ("vary", "Origin"),
        ("x-request-id", "r1"),
    ]
    assert coded_headers(upstream, "gzip") == [
        ("content-type", "text/event-stream; charset=utf-8"),
        ("ETag", 'W/"abc"'),
        ("vary", "Origin, Accept-Encoding"),
        ("x-request-id", "r1"),
        ("Content-Encoding", "gzip"),
    ]


def test_identity_only_varies() -> None:
    upstream = [("Content-Length", "123"), ("ETag", '"abc"'), ("Content-Digest", "sha-256=:x:")]
    assert coded_headers(upstream, "identity") == [*upstream, ("Vary", "Accept-Encoding")]


@pytest.mark.parametrize(
    "vary", [["Accept-Encoding"], ["origin, accept-encoding"], ["*"], ["Origin", "Accept-Encoding"]]
)
def test_a_vary_that_already_says_it_is_kept(vary: list[str]) -> None:
    upstream = [("Vary", value) for value in vary]
    assert [v for n, v in coded_headers(upstream, "br") if n == "Vary"] == vary


def test_a_weak_etag_stays_as_it_is() -> None:
    assert ("ETag", 'W/"abc"') in coded_headers([("ETag", 'W/"abc"')], "zstd")


header_names = st.sampled_from(
    ["Vary", "vary", "ETag", "Content-Length", "Content-Encoding", "Content-Type", "X-Other"]
)
header_values = st.sampled_from(["", "Origin", "accept-encoding", "*", '"t"', 'W/"t"', "gzip"])


@given(
    headers=st.lists(st.tuples(header_names, header_values), max_size=8),
    coding=st.sampled_from(["identity", "gzip", "br", "zstd"]),
)
def test_the_response_always_varies_on_accept_encoding_and_names_its_coding(
    headers: list[tuple[str, str]], coding: str
) -> None:
    out = coded_headers(headers, coding)  # type: ignore[arg-type]
    tokens = {t.strip().lower() for n, v in out if n.lower() == "vary" for t in v.split(",")}
    assert "accept-encoding" in tokens or "*" in tokens
    encodings = [v for n, v in out if n.lower() == "content-encoding"]
    if coding == "identity":
        # Unchanged but for Vary: one field more at most, or one extended.
        others = [h for h in headers if h[0].lower() != "vary"]
        assert [h for h in out if h[0].lower() != "vary"] == others
        assert len(out) - len(headers) in (0, 1)
    else:
        assert encodings == [coding]
        assert "content-length" not in names(out)
        assert all(v.startswith("W/") for n, v in out if n.lower() == "etag")
