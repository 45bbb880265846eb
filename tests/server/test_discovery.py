"""`/.well-known/codec/` on the running app: bytes, hashes, caching, CORS, codings, 404s.

Requests carry no Codec header unless a test says so (discovery must be CORS-simple), and the
fake upstream records every request, so "never relayed" is checked, not assumed.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import brotli
import codecai
import httpx
import pytest
from multidict import CIMultiDict

from proxy.core.compression.dictionaries import LoadedZstdDictionary, ZstdDictionaries
from proxy.core.errors import ConfigError, TokenizerMapError
from proxy.core.maps.discovery import public_origin
from proxy.core.maps.tokenizer_map import PublishedMap
from proxy.maps.publish import publish
from proxy.maps.schema import schema_problems
from proxy.server import create_app
from proxy.server.control import well_known
from proxy.settings import Settings
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests.fake_upstream import FakeUpstream
from tests.server.conftest import MakeProxy, ProxyClient, default_model

REPO = Path(__file__).resolve().parents[2]

DEFAULT_ID = "smollm2-135m-instruct.q4_1"  # derived from SmolLM2-135M-Instruct.Q4_1.gguf
SHORT = "public, max-age=300, stale-while-revalidate=86400"
IMMUTABLE = "public, max-age=31536000, immutable"


def served(proxy: ProxyClient) -> PublishedMap:
    return default_model(proxy).published


async def raw_get(
    proxy: ProxyClient, path: str, **headers: str
) -> tuple[int, CIMultiDict[str], bytes]:
    """GET exactly `path` (no client-side normalization) and the body exactly as sent."""
    url = proxy.make_url("/").with_path(path, encoded=True)
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.get(url, headers=headers, skip_auto_headers=["Accept-Encoding"]) as r:
            return r.status, r.headers.copy(), await r.read()


async def test_the_inline_map_is_the_generated_map(
    proxy: ProxyClient, smollm2_vocabulary: Vocabulary
) -> None:
    published = served(proxy)
    status, headers, body = await raw_get(
        proxy, f"/.well-known/codec/maps/inline/{DEFAULT_ID}.json"
    )
    assert status == 200
    # The map declares the zstd dictionaries the proxy loaded (the shipped SmolLM2 ones).
    records = default_model(proxy).dictionaries.records
    assert [r.format for r in records] == ["msgpack", "protobuf"]
    expected = publish(smollm2_vocabulary.loaded, DEFAULT_ID, records)
    assert body == published.body == expected.body
    assert hashlib.sha256(body).hexdigest() == published.digest
    assert headers["Content-Type"] == "application/json"
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert headers["Cache-Control"] == SHORT
    assert headers["ETag"] == f'"{published.digest}"'
    assert headers["Vary"] == "Accept-Encoding"
    assert "Content-Encoding" not in headers
    assert schema_problems(json.loads(body)) == []


async def test_content_addressed_map_is_immutable(proxy: ProxyClient) -> None:
    published = served(proxy)
    path = f"/.well-known/codec/maps/sha256/{published.digest}.json"
    status, headers, body = await raw_get(proxy, path)
    assert status == 200
    assert body == published.body
    assert headers["Cache-Control"] == IMMUTABLE
    assert headers["ETag"] == f'"{published.digest}"'


async def test_index_lists_the_map_with_an_absolute_url(proxy: ProxyClient) -> None:
    published = served(proxy)
    status, headers, body = await raw_get(proxy, "/.well-known/codec/index.json")
    assert status == 200
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert headers["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'
    # Built from this request's Host: good for that Host only, never from a shared cache.
    assert headers["Cache-Control"].startswith("private")
    assert "Host" in headers["Vary"]
    origin = str(proxy.make_url("/")).rstrip("/")
    dictionaries = [
        {
            "format": record.format,
            "url": f"{origin}/.well-known/codec/dicts/{record.hash.removeprefix('sha256:')}.zstd",
            "hash": record.hash,
        }
        for record in default_model(proxy).dictionaries.records
    ]
    assert json.loads(body) == {
        "codec_version": "0.5",
        "maps": [
            {
                "id": DEFAULT_ID,
                "url": f"{origin}/.well-known/codec/maps/sha256/{published.digest}.json",
                "hash": published.hash,
                # The shipped SmolLM2 dictionaries, fetchable where the index says.
                "zstd_dictionaries": dictionaries,
            }
        ],
    }
    for entry in dictionaries:
        status, _, data = await raw_get(proxy, entry["url"].removeprefix(origin))
        assert status == 200
        assert "sha256:" + hashlib.sha256(data).hexdigest() == entry["hash"]


async def test_a_large_map_by_id_is_a_pointer_codecai_follows(proxy: ProxyClient) -> None:
    # WELL_KNOWN_DISCOVERY.md prefers Form A above ~10 KB; SmolLM2's map is 1.4 MB.
    published = served(proxy)
    assert len(published.body) > 10 * 1024
    status, headers, body = await raw_get(proxy, f"/.well-known/codec/maps/{DEFAULT_ID}.json")
    assert status == 200
    origin = str(proxy.make_url("/")).rstrip("/")
    assert json.loads(body) == {
        "id": DEFAULT_ID,
        "url": f"{origin}/.well-known/codec/maps/sha256/{published.digest}.json",
        "hash": published.hash,
    }
    assert headers["Cache-Control"].startswith("private")  # it names this request's Host
    async with httpx.AsyncClient() as client:
        discovered = await codecai.discover_map(origin=origin, id=DEFAULT_ID, client=client)
    assert discovered.vocab_size == json.loads(published.body)["vocab_size"]


async def test_a_configured_public_url_makes_the_index_shareable(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(public_url="https://models.example.com/")
    published = served(proxy)
    status, headers, body = await raw_get(
        proxy, "/.well-known/codec/index.json", Host="attacker.test"
    )
    assert status == 200
    assert headers["Cache-Control"] == SHORT
    assert headers["Vary"] == "Accept-Encoding"
    [entry] = json.loads(body)["maps"]
    assert entry["url"] == (
        f"https://models.example.com/.well-known/codec/maps/sha256/{published.digest}.json"
    )


@pytest.mark.parametrize(
    "url", ["https://models.example.com/prefix", "https://x.test/?a=1", "https://x.test/#f"]
)
def test_a_public_url_must_be_an_origin(url: str) -> None:
    with pytest.raises(ConfigError, match="public_url"):
        public_origin(url)


@pytest.mark.parametrize("kind", ["inline", "pointer", "sha256", "index"])
async def test_if_none_match_gives_304_with_the_same_headers(proxy: ProxyClient, kind: str) -> None:
    published = served(proxy)
    path = {
        "inline": f"/.well-known/codec/maps/inline/{DEFAULT_ID}.json",
        "pointer": f"/.well-known/codec/maps/{DEFAULT_ID}.json",
        "sha256": f"/.well-known/codec/maps/sha256/{published.digest}.json",
        "index": "/.well-known/codec/index.json",
    }[kind]
    _, first, _ = await raw_get(proxy, path)
    status, headers, body = await raw_get(proxy, path, **{"If-None-Match": first["ETag"]})
    assert (status, body) == (304, b"")
    for name in ("ETag", "Cache-Control", "Access-Control-Allow-Origin", "Vary"):
        assert headers[name] == first[name]
    stale, _, _ = await raw_get(proxy, path, **{"If-None-Match": '"0000"'})
    assert stale == 200


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        ("gzip", "gzip"),
        ("br", "br"),
        ("gzip, br", "br"),
        ("br;q=0.1, gzip", "gzip"),
        ("identity", None),
    ],
)
async def test_codings_keep_the_identity_hash(
    proxy: ProxyClient, accept: str, coding: str | None
) -> None:
    published = served(proxy)
    for path in (
        f"/.well-known/codec/maps/inline/{DEFAULT_ID}.json",
        f"/.well-known/codec/maps/sha256/{published.digest}.json",
        "/.well-known/codec/index.json",
    ):
        status, headers, body = await raw_get(proxy, path, **{"Accept-Encoding": accept})
        assert status == 200
        assert headers.get("Content-Encoding") == coding
        identity = {"gzip": gzip.decompress, "br": brotli.decompress, None: bytes}[coding](body)
        assert headers["ETag"] == f'"{hashlib.sha256(identity).hexdigest()}"'
        if "maps" in path:
            assert identity == published.body
            assert coding is None or len(body) < len(identity) / 2


async def test_head_has_the_get_headers_and_no_body(proxy: ProxyClient) -> None:
    path = f"/.well-known/codec/maps/inline/{DEFAULT_ID}.json"
    _, get_headers, get_body = await raw_get(proxy, path, **{"Accept-Encoding": "gzip"})
    async with proxy.head(path, headers={"Accept-Encoding": "gzip"}) as resp:
        assert resp.status == 200
        assert await resp.read() == b""
        assert resp.headers["Content-Length"] == str(len(get_body))
        assert resp.headers["ETag"] == get_headers["ETag"]
        assert resp.headers["Content-Encoding"] == "gzip"


async def test_preflight_allows_codec_client_version(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    headers = {
        "Origin": "https://app.example.test",
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "codec-client-version",
    }
    async with proxy.options(f"/.well-known/codec/maps/{DEFAULT_ID}.json", headers=headers) as resp:
        assert resp.status == 204
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
        assert resp.headers["Access-Control-Allow-Headers"] == "Codec-Client-Version"
        assert "GET" in resp.headers["Access-Control-Allow-Methods"]
    assert upstream.requests == []


async def test_codec_client_version_changes_nothing(proxy: ProxyClient) -> None:
    path = f"/.well-known/codec/maps/inline/{DEFAULT_ID}.json"
    _, _, plain = await raw_get(proxy, path)
    status, _, versioned = await raw_get(proxy, path, **{"Codec-Client-Version": "0.5"})
    assert (status, versioned) == (200, plain)


async def test_other_methods_are_refused_here(proxy: ProxyClient, upstream: FakeUpstream) -> None:
    async with proxy.post(f"/.well-known/codec/maps/{DEFAULT_ID}.json", data=b"{}") as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "GET, HEAD, OPTIONS"
        assert (await resp.json())["error"]["code"] == "method_not_allowed"
    assert upstream.requests == []


NOT_FOUND = [
    "/.well-known/codec/maps/other.json",
    f"/.well-known/codec/maps/{DEFAULT_ID.upper()}.json",
    "/.well-known/codec/maps/../index.json",
    "/.well-known/codec/maps/x/../../../../etc/passwd.json",
    "/.well-known/codec/maps/%2e%2e/%2e%2e/etc/passwd.json",
    f"/.well-known/codec/maps/{DEFAULT_ID.replace('.', '%2e')}.json",
    "/.well-known/%63odec/index.json",
    f"/.well-known/codec/maps//{DEFAULT_ID}.json",
    f"/.well-known/codec/maps/{DEFAULT_ID}.json/",
    "/.well-known/codec/maps/sha256/" + "0" * 64 + ".json",
    "/.well-known/codec/version-policy.json",
    "/.well-known/codec/",
    "/.well-known/codec",
]


@pytest.mark.parametrize("path", NOT_FOUND)
async def test_unknown_and_traversal_paths_are_404_and_never_relayed(
    proxy: ProxyClient, upstream: FakeUpstream, path: str
) -> None:
    status, headers, body = await raw_get(proxy, path)
    assert status == 404
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert json.loads(body)["error"]["code"] == "not_found"
    assert upstream.requests == []


@pytest.mark.parametrize("host", ["evil.test/x?", "evil.test:80@x", "evil.test\\x"])
async def test_a_bad_host_header_gets_no_index(proxy: ProxyClient, host: str) -> None:
    # A plain host is written into the index's URLs...
    status, _, body = await raw_get(proxy, "/.well-known/codec/index.json", Host="good.test:8080")
    assert status == 200
    [entry] = json.loads(body)["maps"]
    assert entry["url"].startswith("http://good.test:8080/.well-known/codec/maps/sha256/")
    # ...anything else is not: the one JSON 404, with nothing of the Host in it.
    status, headers, body = await raw_get(proxy, "/.well-known/codec/index.json", Host=host)
    assert status == 404
    assert headers["Content-Type"].startswith("application/json")
    document = json.loads(body)
    assert set(document) == {"error"}  # no "maps"
    assert document["error"]["code"] == "not_found"
    assert b"evil" not in body


async def test_codec_streams_name_the_served_map(proxy: ProxyClient) -> None:
    payload = {"prompt": "Hi", "max_tokens": 8, "stream_format": "msgpack"}
    async with proxy.post("/v1/completions", json=payload) as resp:
        assert resp.status == 200
        await resp.read()
        header = resp.headers["Codec-Tokenizer-Map"]
    published = served(proxy)
    assert header == f"{DEFAULT_ID} sha256:{published.digest}"
    status, _, body = await raw_get(
        proxy, f"/.well-known/codec/maps/inline/{header.split()[0]}.json"
    )
    assert status == 200
    assert "sha256:" + hashlib.sha256(body).hexdigest() == header.split()[1]


async def test_json_pass_through_has_no_codec_header(proxy: ProxyClient) -> None:
    async with proxy.post("/v1/completions", json={"prompt": "Hi", "stream": True}) as resp:
        assert resp.status == 200
        await resp.read()
        assert "Codec-Tokenizer-Map" not in resp.headers


async def test_a_configured_map_id(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(map_id="huggingfacetb/smollm2-135m")
    status, _, body = await raw_get(
        proxy, "/.well-known/codec/maps/inline/huggingfacetb/smollm2-135m.json"
    )
    assert status == 200
    assert json.loads(body)["id"] == "huggingfacetb/smollm2-135m"
    missing, _, _ = await raw_get(proxy, f"/.well-known/codec/maps/inline/{DEFAULT_ID}.json")
    assert missing == 404


def test_an_unpublishable_map_id_fails_at_start(
    settings: Settings, smollm2_vocabulary: Vocabulary
) -> None:
    with pytest.raises(TokenizerMapError, match="map id 'SmolLM2'"):
        create_app(replace(settings, map_id="SmolLM2"), smollm2_vocabulary)


async def test_injected_zstd_dictionaries_are_declared(
    settings: Settings, smollm2_vocabulary: Vocabulary, aiohttp_client: Any
) -> None:
    data = (REPO / "dictionaries" / "smollm2-protobuf-v1.zstd").read_bytes()
    dictionaries = ZstdDictionaries([LoadedZstdDictionary.build("protobuf", data)])
    app = create_app(settings, smollm2_vocabulary, dictionaries=dictionaries)
    proxy = await aiohttp_client(app)
    status, _, body = await raw_get(proxy, f"/.well-known/codec/maps/inline/{DEFAULT_ID}.json")
    assert status == 200
    declared = json.loads(body)["zstd_dictionaries"]
    assert declared == [dictionaries.records[0].to_json()]
    assert declared[0]["hash"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert schema_problems(json.loads(body)) == []
    empty = create_app(settings, smollm2_vocabulary, dictionaries=ZstdDictionaries())
    assert default_model(app).published.digest != default_model(empty).published.digest


async def test_concurrent_first_requests_compress_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []

    def counting(body: bytes) -> bytes:
        calls.append(body)
        return gzip.compress(body, mtime=0)

    monkeypatch.setitem(well_known.COMPRESSORS, "gzip", counting)
    published = PublishedMap("a", b"x" * 1000, "0" * 64)
    store = well_known.MapStore([published])
    results = await asyncio.gather(*(store.encoded(published, "gzip") for _ in range(5)))
    assert len(calls) == 1
    assert {gzip.decompress(r) for r in results} == {published.body}


async def test_a_map_as_tokenizer_is_served_byte_for_byte(
    tmp_path: Path, settings: Settings, smollm2_vocabulary: Vocabulary, aiohttp_client: Any
) -> None:
    # What `codec-proxy map generate` writes, given back as --tokenizer, is what is served
    # (by a proxy without zstd dictionaries: loaded ones are listed in the map it serves).
    original = publish(smollm2_vocabulary.loaded, "huggingfacetb/smollm2")
    path = tmp_path / "smollm2.json"
    path.write_bytes(original.body)
    vocabulary = Vocabulary.build(load_tokenizer(path))
    app = create_app(replace(settings, tokenizer=path), vocabulary, dictionaries=ZstdDictionaries())
    proxy = await aiohttp_client(app)
    status, headers, body = await raw_get(
        proxy, "/.well-known/codec/maps/inline/huggingfacetb/smollm2.json"
    )
    assert status == 200
    assert body == original.body
    assert headers["ETag"] == f'"{original.digest}"'
