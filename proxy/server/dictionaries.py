"""The zstd dictionaries at the edge: loaded with the app, served at their well-known URL."""

from __future__ import annotations

from aiohttp import web

from proxy.core.dictionaries import ZstdDictionaries, is_sha256_hex
from proxy.dictionaries.load import load_dictionaries
from proxy.server.keys import ZSTD_DICTIONARIES, Vocabulary
from proxy.settings import DEFAULT_DICTIONARIES_MANIFEST, Settings

# Content-addressed: the bytes behind a hash never change (WKD v0.5 `dicts/`).
_IMMUTABLE = "public, max-age=31536000, immutable"


def load_app_dictionaries(settings: Settings, vocabulary: Vocabulary) -> ZstdDictionaries:
    """`DictionaryError` if a dictionary does not match its manifest (refuse to start)."""
    manifest = settings.dictionaries_manifest
    return load_dictionaries(
        manifest,
        settings.zstd_dicts,
        vocabulary_sha256=vocabulary.vocabulary_sha256,
        # The shipped manifest may be absent (an installed wheel); one named in settings may not.
        manifest_required=manifest is not None and manifest != DEFAULT_DICTIONARIES_MANIFEST,
    )


async def dictionary_handler(request: web.Request) -> web.Response:
    """`GET /.well-known/codec/dicts/<64-hex>.zstd`: the raw dictionary bytes."""
    name = request.match_info["name"]
    hex_digest = name.removesuffix(".zstd")
    dictionary = None
    if name.endswith(".zstd") and is_sha256_hex(hex_digest):
        dictionary = request.app[ZSTD_DICTIONARIES].by_hex(hex_digest)
    if dictionary is None:
        raise web.HTTPNotFound(text="no such zstd dictionary\n")
    return web.Response(
        body=dictionary.data,
        content_type="application/octet-stream",
        headers={"Cache-Control": _IMMUTABLE},
    )
