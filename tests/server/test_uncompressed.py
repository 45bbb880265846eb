"""Responses left uncompressed (`uncompressed`, `uncompressed_keys`), whatever the client
accepts: compression makes an answer's length an oracle for a secret in it beside text a third
party chose (BREACH, docs/COMPRESSION.md "When not to compress")."""

from __future__ import annotations

import dataclasses
import gzip
from typing import Any

import codecai
import pytest

from proxy.server.models.live import LIVE
from proxy.server.process.reload import reload
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient, app_of
from tests.server.test_json_compression import json_capture

KEY = "sk-breach-7f3a"
CAPTURE = "llamacpp-completions-sample.txt"
JSON_BODY: dict[str, Any] = {"prompt": "Hi", "max_tokens": 8, "stream": True}


async def answer(
    proxy: ProxyClient, *, key: str | None = None, codec: bool = False, accept: str = "gzip"
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Accept-Encoding": accept}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = JSON_BODY
    if codec:
        headers = codecai.with_codec_client_version(headers)
        body = {**JSON_BODY, "stream_format": "msgpack"}
    async with proxy.post(
        "/v1/completions", json=body, headers=headers, auto_decompress=False
    ) as resp:
        return resp.status, dict(resp.headers), await resp.read()


@pytest.mark.parametrize("codec", [False, True], ids=["json", "codec"])
async def test_a_keys_responses_go_uncompressed(
    make_proxy: MakeProxy, upstream: FakeUpstream, codec: bool
) -> None:
    proxy = await make_proxy(json_compression="on", uncompressed_keys=("other", KEY))
    upstream.script = Script(load_capture(CAPTURE))
    status, headers, wire = await answer(proxy, key=KEY, codec=codec)
    assert status == 200
    assert "Content-Encoding" not in headers
    if not codec:
        assert wire == load_capture(CAPTURE).body
    # Another key, or none, gets what it asks for.
    for key in ("someone-else", None):
        upstream.script = Script(load_capture(CAPTURE))
        _, headers, wire = await answer(proxy, key=key, codec=codec)
        assert headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(wire)


async def test_a_models_whole_json_goes_uncompressed(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(json_compression="on", uncompressed=True)
    upstream.script = Script(json_capture())
    status, headers, wire = await answer(proxy)
    assert status == 200
    assert "Content-Encoding" not in headers
    assert wire == json_capture().body


async def test_a_codec_client_refusing_identity_gets_the_406(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(uncompressed=True)
    upstream.script = Script(load_capture(CAPTURE))
    status, _, body = await answer(proxy, codec=True, accept="gzip, identity;q=0")
    assert status == 406
    assert b"no_acceptable_encoding" in body
    assert upstream.requests == []  # refused before the backend was asked


async def test_a_reload_leaves_them_uncompressed_from_the_next_request(
    proxy: ProxyClient, upstream: FakeUpstream
) -> None:
    app = app_of(proxy)
    for uncompressed, expected in ((True, None), (False, "gzip")):
        live = app[LIVE].current.settings
        result = await reload(app, dataclasses.replace(live, uncompressed=uncompressed))
        assert result.ok
        assert result.changed == ("uncompressed",)
        upstream.script = Script(load_capture(CAPTURE))
        _, headers, _ = await answer(proxy, codec=True)
        assert headers.get("Content-Encoding") == expected
