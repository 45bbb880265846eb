"""Rolling Codec out, end to end on the real llama.cpp server (SmolLM2) with the real codecai
client: allow and deny by API key, a reload while streams are in flight, a broken reload.

codecai discovers the model's map (following the pointer), decodes the frames and renders them
with its own `Detokenizer`; what it reads must be what a JSON client of the same request reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import codecai
import httpx
import pytest

from proxy.server import create_app
from proxy.server.models.live import LIVE
from proxy.server.process.reload import reload
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames
from tests.server.conftest import AiohttpClient, ProxyClient, app_of
from tests.test_e2e_llamacpp import request_body

pytestmark = pytest.mark.backend

PROMPT = "The capital of France is"


@pytest.fixture
async def proxy(
    llama_server: str,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
) -> ProxyClient:
    settings = pinned_draws.settings(
        upstream=(llama_server,),
        tokenizer=smollm2_gguf,
        drift_check=False,
        # Only team-a's key gets Codec; team-b is denied outright.
        codec_allow_keys=("team-a", "team-b"),
        codec_deny_keys=("team-b",),
    )
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


def origin(proxy: ProxyClient) -> str:
    return str(proxy.make_url("/")).rstrip("/")


@dataclasses.dataclass
class Progress:
    """Where a Codec response body is: its first bytes in, and its last."""

    started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    ended: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


async def codec_text(
    client: httpx.AsyncClient,
    proxy: ProxyClient,
    key: str,
    progress: Progress | None = None,
    **body: Any,
) -> tuple[int, str, dict[str, Any] | None]:
    """Status, the text codecai renders from the frames (200) or "", and the error (else)."""
    progress = progress or Progress()
    headers = codecai.with_codec_client_version({"Authorization": f"Bearer {key}"})
    payload = {**request_body(PROMPT), "stream_format": "msgpack", **body}
    url = f"{origin(proxy)}/v1/completions"
    async with client.stream("POST", url, json=payload, headers=headers) as response:
        if response.status_code != 200:
            return response.status_code, "", json.loads(await response.aread())["error"]
        content = bytearray()
        async for chunk in response.aiter_bytes():
            content += chunk
            progress.started.set()
        progress.ended.set()
    map_id = response.headers["Codec-Tokenizer-Map"].split()[0]
    tokenizer_map = await codecai.discover_map(origin=origin(proxy), id=map_id, client=client)
    frames = await codecai_frames(bytes(content), "msgpack")
    assert [f.done for f in frames].count(True) == 1
    assert frames[-1].done
    text = codecai.Detokenizer(tokenizer_map).render([i for f in frames for i in f.ids])
    return 200, text, None


async def json_text(client: httpx.AsyncClient, proxy: ProxyClient, key: str, **body: Any) -> str:
    """The text a JSON client reads for the same request."""
    payload = {**request_body(PROMPT), "stream": False, **body}
    response = await client.post(
        f"{origin(proxy)}/v1/completions", json=payload,
        headers={"Authorization": f"Bearer {key}"},
    )  # fmt: skip
    assert response.status_code == 200
    text: str = response.json()["choices"][0]["text"]
    return text


async def test_allowed_keys_get_codec_and_the_others_json(proxy: ProxyClient) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        expected = await json_text(client, proxy, "team-a")
        status, text, _ = await codec_text(client, proxy, "team-a")
        assert (status, text) == (200, expected)
        for key in ("team-b", "someone-else"):
            status, _, error = await codec_text(client, proxy, key)
            assert status == 403
            assert error is not None
            assert error["code"] == "codec_not_enabled"
            # The documented fallback: the same request without stream_format, as JSON.
            assert await json_text(client, proxy, key) == expected


async def test_a_reload_under_load_leaves_streams_in_flight_unharmed(proxy: ProxyClient) -> None:
    app = app_of(proxy)
    async with httpx.AsyncClient(timeout=60) as client:
        expected = await json_text(client, proxy, "team-a")
        long_body = {"max_tokens": 64}
        streams = [Progress() for _ in range(3)]
        in_flight = [
            asyncio.create_task(codec_text(client, proxy, "team-a", stream, **long_body))
            for stream in streams
        ]
        # Every stream under way on llama.cpp's slots: its first frames read by the client.
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in streams)), 60)
        off = dataclasses.replace(app[LIVE].current.settings, codec_enabled=False)
        result = await reload(app, off)
        assert result.ok
        assert "codec_enabled" in result.changed
        # The reload came mid-stream: none of the bodies had ended.
        assert not any(s.ended.is_set() for s in streams)
        # A request after the reload gets the new answer at once ...
        status, _, error = await codec_text(client, proxy, "team-a")
        assert status == 403
        assert error is not None
        assert error["code"] == "codec_not_enabled"
        # ... while the streams that started before it end as they began: whole, and right.
        finished = await asyncio.gather(*in_flight)
        longer = await json_text(client, proxy, "team-a", **long_body)
        for status, text, _ in finished:
            assert status == 200
            assert text == longer
        assert longer.startswith(expected)


async def test_a_broken_reload_changes_nothing(proxy: ProxyClient, tmp_path: Path) -> None:
    app = app_of(proxy)
    before = app[LIVE].current
    broken = dataclasses.replace(before.settings, safety_policy=tmp_path / "missing-policy.toml")
    result = await reload(app, broken)
    assert not result.ok
    assert app[LIVE].current is before
    async with httpx.AsyncClient(timeout=60) as client:
        status, text, _ = await codec_text(client, proxy, "team-a")
        assert status == 200
        assert text == await json_text(client, proxy, "team-a")
    async with proxy.get("/metrics") as resp:
        metrics = await resp.text()
    assert 'codec_proxy_config_reloads_total{result="error"} 1.0' in metrics
