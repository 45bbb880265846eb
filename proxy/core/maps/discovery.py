"""`/.well-known/codec/` discovery, sans IO: which document a raw path names, the index
document, and the caching, CORS and content-coding decisions for a reply.

Paths (codec-spec.md §3.5): `maps/<id>.json` (the map inline, Form B, or for a map above
`POINTER_ABOVE_BYTES` a Form A pointer `{id, url, hash}` to its content-addressed copy, as the
discovery convention prefers for maps over ~10 KB), `maps/inline/<id>.json` (always inline),
`maps/sha256/<hex>.json` (content-addressed, the I-D's SHOULD), `index.json`
(`{codec_version, maps: [{id, url, hash, models, zstd_dictionaries}]}`). `read_index` is the
other side: a Codec server's index as a client of it reads it.

The path is read raw, as the client sent it: a valid id never needs percent-encoding, so any
`%` (an encoded `/`, `.` or anything else) names nothing, and neither does an id that fails
`map_id_problem`. Nothing is ever looked up on a filesystem; documents are in memory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import orjson

from proxy.core.errors import ConfigError, UpstreamProtocolError
from proxy.core.http.content_coding import parse_accept_encoding, weight
from proxy.core.maps.ids import CONTENT_ADDRESSED_PREFIX, INLINE_PREFIX, map_id_problem
from proxy.core.maps.tokenizer_map import PublishedMap

WELL_KNOWN_PREFIX = "/.well-known/codec/"
MAPS_PREFIX = "maps/"
# WELL_KNOWN_DISCOVERY.md: "Maintainers SHOULD prefer Form A for any map larger than ~10 KB".
# Every real vocabulary is (SmolLM2's map is 1.4 MB), so `maps/<id>.json` is a pointer for them.
POINTER_ABOVE_BYTES = 10 * 1024
DICTS_PATH = WELL_KNOWN_PREFIX + "dicts/"
# The Codec version whose discovery layout the index describes (v0.5, the current spec).
INDEX_CODEC_VERSION = "0.5"

# WELL_KNOWN_DISCOVERY.md recommends this for documents that may change under the same URL.
SHORT_CACHE_CONTROL = "public, max-age=300, stale-while-revalidate=86400"
# An index whose URLs were built from the request's Host is only good for that Host: a shared
# cache that keys on something else (a CDN rewriting Host) must not hand it to other clients.
HOST_DERIVED_CACHE_CONTROL = "private, max-age=300"
# A content-addressed document can never change: its URL is its hash.
IMMUTABLE_CACHE_CONTROL = "public, max-age=31536000, immutable"

# Browser clients: the discovery GETs are CORS-simple (no Codec header is required), but the
# reference `discover_version_policy` adds Codec-Client-Version, which needs a preflight
# (codec-spec.md §3.5).
CORS_ALLOW_ORIGIN = ("Access-Control-Allow-Origin", "*")
PREFLIGHT_HEADERS: tuple[tuple[str, str], ...] = (
    CORS_ALLOW_ORIGIN,
    ("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS"),
    ("Access-Control-Allow-Headers", "Codec-Client-Version"),
    ("Access-Control-Max-Age", "86400"),
)

Coding = Literal["br", "gzip"]
# Our preference among codings the client accepts equally (br is smaller on JSON maps).
CODING_PREFERENCE: tuple[Coding, ...] = ("br", "gzip")

_DIGEST = re.compile(r"[0-9a-f]{64}")
# A Host header we are willing to write into index.json: a name or an address, and a port.
_HOST = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


@dataclass(frozen=True)
class IndexDocument:
    """`index.json`."""


@dataclass(frozen=True)
class MapById:
    map_id: str


@dataclass(frozen=True)
class MapInline:
    map_id: str


@dataclass(frozen=True)
class MapByDigest:
    digest: str


DiscoveryTarget = IndexDocument | MapById | MapInline | MapByDigest


def discovery_target(raw_path: str) -> DiscoveryTarget | None:
    """The document a raw request path (query included or not) names, or None for a 404."""
    path = raw_path.partition("?")[0]
    if not path.startswith(WELL_KNOWN_PREFIX):
        return None
    rest = path[len(WELL_KNOWN_PREFIX) :]
    if rest == "index.json":
        return IndexDocument()
    if not (rest.startswith(MAPS_PREFIX) and rest.endswith(".json")):
        return None
    name = rest[len(MAPS_PREFIX) : -len(".json")]
    if name.startswith(CONTENT_ADDRESSED_PREFIX):
        digest = name[len(CONTENT_ADDRESSED_PREFIX) :]
        return MapByDigest(digest) if _DIGEST.fullmatch(digest) else None
    if name.startswith(INLINE_PREFIX):
        map_id = name[len(INLINE_PREFIX) :]
        return MapInline(map_id) if map_id_problem(map_id) is None else None
    return MapById(name) if map_id_problem(name) is None else None


def content_addressed_path(published: PublishedMap) -> str:
    return map_path_by_digest(published.digest)


def map_path_by_digest(digest: str) -> str:
    """Where the map whose bytes hash to `digest` (64 hex) is served: the path a client that
    knows only the digest (from `Codec-Tokenizer-Map`) fetches and checks the bytes against."""
    return f"{WELL_KNOWN_PREFIX}{MAPS_PREFIX}{CONTENT_ADDRESSED_PREFIX}{digest}.json"


def origin_of(scheme: str, host: str | None) -> str | None:
    """`scheme://host` for index URLs, or None when the Host header is not a plain host."""
    if scheme not in ("http", "https") or host is None or not _HOST.fullmatch(host):
        return None
    return f"{scheme}://{host}"


def public_origin(url: str) -> str:
    """A configured public URL as the origin index URLs start with; ConfigError when it is
    more than an origin (`/.well-known/` is at the root of one, RFC 8615 §3)."""
    parts = urlsplit(url)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(f"public_url must be scheme://host[:port] and nothing more, got {url!r}")
    return f"{parts.scheme}://{parts.netloc}"


def is_pointed_to(published: PublishedMap) -> bool:
    """Whether `maps/<id>.json` answers with a pointer rather than the map inline."""
    return len(published.body) > POINTER_ABOVE_BYTES


def pointer_body(origin: str, published: PublishedMap) -> bytes:
    """The Form A pointer for `maps/<id>.json`: the content-addressed copy and its hash.

    Pointers must not chain (WELL_KNOWN_DISCOVERY.md): the URL is the map itself, and its
    `hash` is over exactly the bytes served there.
    """
    document = {
        "id": published.id,
        "url": origin + content_addressed_path(published),
        "hash": published.hash,
    }
    return orjson.dumps(document, option=orjson.OPT_APPEND_NEWLINE)


@dataclass(frozen=True)
class IndexEntry:
    """One map in `index.json`: the models it serves and their zstd dictionaries."""

    published: PublishedMap
    models: tuple[str, ...] = ()
    # (wire format, 64-hex sha256) of each dictionary the models compress with.
    dictionaries: tuple[tuple[str, str], ...] = ()


def index_body(origin: str, entries: Sequence[IndexEntry | PublishedMap]) -> bytes:
    """`index.json` for clients of `origin` (scheme://host[:port]): one pointer per map.

    Each `url` is the content-addressed document, so a pointer never goes stale while its
    `hash` holds; codecai requires an absolute http(s) URL (interop.md §1.6). Beside the
    pointer fields, which clients read, each entry names the models served with the map
    (`models`, the names requests use) and their dictionaries (`zstd_dictionaries`, as in the
    map); pointer readers ignore both.
    """
    documents = []
    for entry in entries:
        if isinstance(entry, PublishedMap):
            entry = IndexEntry(entry)
        m = entry.published
        document: dict[str, object] = {
            "id": m.id,
            "url": origin + content_addressed_path(m),
            "hash": m.hash,
        }
        if entry.models:
            document["models"] = list(entry.models)
        if entry.dictionaries:
            document["zstd_dictionaries"] = [
                {"format": fmt, "url": f"{origin}{DICTS_PATH}{hex_}.zstd", "hash": f"sha256:{hex_}"}
                for fmt, hex_ in entry.dictionaries
            ]
        documents.append(document)
    document = {"codec_version": INDEX_CODEC_VERSION, "maps": documents}
    return orjson.dumps(document, option=orjson.OPT_APPEND_NEWLINE)


@dataclass(frozen=True)
class IndexPointer:
    """One map of a Codec server's `index.json`: its id, the digest its bytes hash to, and the
    model names the server lists for it (none: the server did not say)."""

    map_id: str
    digest: str
    models: tuple[str, ...] = ()


def read_index(body: bytes) -> tuple[IndexPointer, ...]:
    """A Codec server's `index.json` as a client reads it: the pointers whose `hash` is a whole
    sha256 (a map can only be pinned by one); other entries are skipped. `url` is not read: a
    map is fetched by its digest from the server's own content-addressed path, and the digest
    is what is trusted. `UpstreamProtocolError` when the body is no index at all."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(f"index.json is not JSON: {exc}") from exc
    entries = document.get("maps") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise UpstreamProtocolError("index.json has no 'maps' list")
    pointers = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        map_id, hash_ = entry.get("id"), entry.get("hash")
        if not isinstance(map_id, str) or not isinstance(hash_, str):
            continue
        digest = hash_.removeprefix("sha256:")
        if not hash_.startswith("sha256:") or not _DIGEST.fullmatch(digest):
            continue
        models = entry.get("models")
        names = tuple(m for m in models if isinstance(m, str)) if isinstance(models, list) else ()
        pointers.append(IndexPointer(map_id, digest, names))
    return tuple(pointers)


def pointer_for(pointers: Sequence[IndexPointer], names: Sequence[str]) -> IndexPointer | None:
    """The map a server lists for a model it knows by one of `names`; without such an entry,
    its only map (a server of one model need not name it); else None: nothing says which."""
    for pointer in pointers:
        if any(name in pointer.models for name in names):
            return pointer
    return pointers[0] if len(pointers) == 1 else None


def entity_tag(digest: str) -> str:
    """The strong ETag of a document: its sha256, quoted (RFC 9110 §8.8.3).

    One tag for every content coding: it names the identity bytes, whose hash clients check,
    and `Vary: Accept-Encoding` keeps caches from mixing the codings up.
    """
    return f'"{digest}"'


def if_none_match(header: str | None, tag: str) -> bool:
    """Whether `If-None-Match` matches `tag`: weak comparison, `*` matches (RFC 9110 §13.1.2)."""
    if header is None:
        return False
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == tag:
            return True
    return False


def choose_coding(accept_encoding: str | None) -> Coding | None:
    """The content coding for a discovery reply: br or gzip if accepted (q > 0), else identity.

    RFC 9110 §12.5.3: `*` stands for any coding not listed; the highest q wins and ties go to
    our preference. Identity is always possible, so a refused one changes nothing here.
    """
    if not accept_encoding:
        return None
    accepted = parse_accept_encoding(accept_encoding)
    ranked = [
        (weight(accepted, coding), -rank, coding) for rank, coding in enumerate(CODING_PREFERENCE)
    ]
    q, _, coding = max(ranked)
    return coding if q > 0 else None


def reply_headers(digest: str, cache_control: str, coding: Coding | None) -> list[tuple[str, str]]:
    """Headers of a 200 or 304 discovery reply (a 304 repeats them, RFC 9110 §15.4.5)."""
    headers = [
        ("Content-Type", "application/json"),
        CORS_ALLOW_ORIGIN,
        ("Cache-Control", cache_control),
        ("ETag", entity_tag(digest)),
        ("Vary", "Accept-Encoding"),
    ]
    if coding is not None:
        headers.append(("Content-Encoding", coding))
    return headers
