"""Discovery decisions, sans IO: which raw paths name a document, index, ETags, codings."""

from __future__ import annotations

import json

import pytest

from proxy.core.errors import UpstreamProtocolError
from proxy.core.maps.discovery import (
    IMMUTABLE_CACHE_CONTROL,
    SHORT_CACHE_CONTROL,
    IndexDocument,
    IndexEntry,
    IndexPointer,
    MapByDigest,
    MapById,
    choose_coding,
    discovery_target,
    entity_tag,
    if_none_match,
    index_body,
    map_path_by_digest,
    origin_of,
    pointer_for,
    read_index,
    reply_headers,
)
from proxy.core.maps.tokenizer_map import PublishedMap

DIGEST = "0123456789abcdef" * 4
MAP = PublishedMap(id="qwen/qwen3", body=b"{}\n", digest=DIGEST)


@pytest.mark.parametrize(
    ("raw_path", "target"),
    [
        ("/.well-known/codec/index.json", IndexDocument()),
        ("/.well-known/codec/index.json?x=1", IndexDocument()),
        ("/.well-known/codec/maps/qwen/qwen3.json", MapById("qwen/qwen3")),
        ("/.well-known/codec/maps/a.b-c_d.json", MapById("a.b-c_d")),
        (f"/.well-known/codec/maps/sha256/{DIGEST}.json", MapByDigest(DIGEST)),
    ],
)
def test_documents_by_path(raw_path: str, target: object) -> None:
    assert discovery_target(raw_path) == target


def test_a_digest_names_the_path_that_serves_its_map() -> None:
    # What a client fetches knowing only `Codec-Tokenizer-Map`'s digest is what is served.
    assert discovery_target(map_path_by_digest(DIGEST)) == MapByDigest(DIGEST)


@pytest.mark.parametrize(
    "raw_path",
    [
        "/.well-known/codec/maps/../index.json",
        "/.well-known/codec/maps/qwen/../../etc/passwd.json",
        "/.well-known/codec/maps/%2e%2e/x.json",
        "/.well-known/codec/maps/qwen%2fqwen3.json",
        "/.well-known/codec/maps/..%2fx.json",
        "/.well-known/%63odec/maps/x.json",
        "/.well-known/codec/maps//x.json",
        "/.well-known/codec/maps/x/.json",
        "/.well-known/codec/maps/./x.json",
        "/.well-known/codec/maps/Qwen/Qwen3.json",
        "/.well-known/codec/maps/x.JSON",
        "/.well-known/codec/maps/x",
        "/.well-known/codec/maps/.json",
        f"/.well-known/codec/maps/sha256/{DIGEST.upper()}.json",
        f"/.well-known/codec/maps/sha256/{DIGEST[:-1]}.json",
        "/.well-known/codec/maps/sha256/x.json",
        "/.well-known/codec/Index.json",
        "/.well-known/codec/",
        "/.well-known/codec",
        "/.well-known/codec/version-policy.json",
        "/other",
    ],
)
def test_everything_else_names_nothing(raw_path: str) -> None:
    assert discovery_target(raw_path) is None


def test_index_points_at_the_content_addressed_document() -> None:
    body = index_body("http://127.0.0.1:8080", [MAP])
    assert body.endswith(b"\n")
    assert json.loads(body) == {
        "codec_version": "0.5",
        "maps": [
            {
                "id": "qwen/qwen3",
                "url": f"http://127.0.0.1:8080/.well-known/codec/maps/sha256/{DIGEST}.json",
                "hash": f"sha256:{DIGEST}",
            }
        ],
    }


@pytest.mark.parametrize(
    ("scheme", "host", "origin"),
    [
        ("http", "127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("https", "proxy.example.test", "https://proxy.example.test"),
        ("http", "[::1]:8080", "http://[::1]:8080"),
        ("http", "evil.test/x?y", None),
        ("http", "a b", None),
        ("http", None, None),
        ("ftp", "host", None),
    ],
)
def test_origins_written_into_the_index(scheme: str, host: str | None, origin: str | None) -> None:
    assert origin_of(scheme, host) == origin


def test_entity_tags_and_if_none_match() -> None:
    tag = entity_tag(DIGEST)
    assert tag == f'"{DIGEST}"'
    assert if_none_match(tag, tag)
    assert if_none_match(f'"other", W/{tag}', tag)  # weak comparison (RFC 9110 §13.1.2)
    assert if_none_match("*", tag)
    assert not if_none_match('"other"', tag)
    assert not if_none_match(DIGEST, tag)  # unquoted is not the same tag
    assert not if_none_match(None, tag)


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        (None, None),
        ("", None),
        ("identity", None),
        ("gzip", "gzip"),
        ("br", "br"),
        ("gzip, deflate, br", "br"),
        ("GZIP;q=1, br;q=0.5", "gzip"),
        ("br;q=0, gzip;q=0", None),
        ("*", "br"),
        ("*;q=0.5, br;q=0", "gzip"),
        ("zstd", None),
        ("gzip;q=nonsense", None),
    ],
)
def test_coding_choice(accept: str | None, coding: str | None) -> None:
    assert choose_coding(accept) == coding


def test_reply_headers() -> None:
    headers = dict(reply_headers(DIGEST, IMMUTABLE_CACHE_CONTROL, "gzip"))
    assert headers == {
        "Content-Type": "application/json",
        "Access-Control-Allow-Origin": "*",
        "Cache-Control": IMMUTABLE_CACHE_CONTROL,
        "ETag": f'"{DIGEST}"',
        "Vary": "Accept-Encoding",
        "Content-Encoding": "gzip",
    }
    assert "Content-Encoding" not in dict(reply_headers(DIGEST, SHORT_CACHE_CONTROL, None))


def test_an_index_reads_back_as_the_pointers_it_was_written_from() -> None:
    other = PublishedMap(id="smollm2", body=b"[]\n", digest="f" * 64)
    entries = [IndexEntry(MAP, models=("qwen3", "qwen")), IndexEntry(other)]
    pointers = read_index(index_body("http://a.test", entries))
    assert pointers == (
        IndexPointer("qwen/qwen3", DIGEST, ("qwen3", "qwen")),
        IndexPointer("smollm2", "f" * 64),
    )
    assert pointer_for(pointers, ["qwen"]) == pointers[0]
    # Two maps and no name listed: nothing says which is this model's.
    assert pointer_for(pointers, ["llama"]) is None
    assert pointer_for(pointers[1:], ["llama"]) == pointers[1]
    assert pointer_for((), ["llama"]) is None


@pytest.mark.parametrize(
    "entry",
    [
        {"id": "a", "hash": "sha256:abc"},  # a shortened digest cannot pin a map
        {"id": "a", "hash": DIGEST},  # no sha256: prefix
        {"id": "a", "hash": f"sha256:{DIGEST.upper()}"},
        {"id": 1, "hash": f"sha256:{DIGEST}"},
        {"hash": f"sha256:{DIGEST}"},
        "not an entry",
    ],
)
def test_index_entries_that_pin_nothing_are_skipped(entry: object) -> None:
    good = {"id": "b", "hash": f"sha256:{DIGEST}", "models": ["m", 3]}
    body = json.dumps({"codec_version": "0.5", "maps": [entry, good]}).encode()
    assert read_index(body) == (IndexPointer("b", DIGEST, ("m",)),)


@pytest.mark.parametrize("body", [b"<html>", b"[]", b'{"maps": {}}', b"{}"])
def test_a_body_that_is_no_index_is_refused(body: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        read_index(body)
