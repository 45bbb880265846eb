"""End to end: two codec-proxies chained in front of the real llama.cpp server (SmolLM2-135M).

    OpenAI SDK ─JSON─► edge (upstream_protocol = "codec") ══Codec══► inner ─JSON─► llama.cpp

The long hop, edge to inner, carries Codec frames; the SDK and llama.cpp speak JSON as ever. At
temperature 0 (fixed seed, no prompt cache) the text and finish reason the SDK reads through the
chain equal what it reads from llama.cpp directly. The middle hop's bytes (what the edge received,
its `codec_proxy_upstream_bytes_total`) per token, next to llama.cpp's JSON for the same
requests (what a pass-through hop would have carried: the inner relays JSON byte for byte), go
to `.cache/reports/e2e-two-proxies.json` (docs/DEPLOY.md "Codec on the long hop").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from proxy import assets
from proxy.server import create_app
from proxy.server.control import codec_upstream
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.test_e2e_llamacpp import MAX_TOKENS, PROMPTS
from tests.test_e2e_openai_sdk_llamacpp import DETERMINISTIC, QUESTIONS, Downloads

pytestmark = pytest.mark.backend

REPORT: dict[str, Any] = {}


@pytest.fixture
async def inner(
    llama_server: str,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
) -> ProxyClient:
    """The server side, as deployed: backend IDs, the shipped dictionaries, the flush schedule."""
    settings = pinned_draws.settings(
        upstream=(llama_server,), tokenizer=smollm2_gguf, drift_check=False
    )
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


@pytest.fixture
async def edge(inner: ProxyClient, aiohttp_client: AiohttpClient) -> ProxyClient:
    """The client side: no tokenizer, the inner's map pinned from its index."""
    upstream = str(inner.make_url("")).rstrip("/")
    settings = pinned_draws.settings(upstream=(upstream,), upstream_protocol="codec")
    return await aiohttp_client(create_app(settings))


class Metrics:
    """The edge's own count of the middle hop: body bytes in, token IDs rendered."""

    def __init__(self, edge: ProxyClient) -> None:
        self._edge = edge

    async def read(self) -> tuple[float, float]:
        async with self._edge.get("/metrics") as resp:
            text = await resp.text()
        wire = tokens = 0.0
        for line in text.splitlines():
            if line.startswith('codec_proxy_upstream_bytes_total{mode="rendered"'):
                wire += float(line.rsplit(" ", 1)[1])
            elif line.startswith("codec_proxy_rendered_tokens_total{"):
                tokens += float(line.rsplit(" ", 1)[1])
        return wire, tokens


def client_of(base_url: str, downloads: Downloads) -> tuple[httpx.AsyncClient, AsyncOpenAI]:
    http = httpx.AsyncClient(event_hooks={"response": [downloads.ahook]})
    sdk = AsyncOpenAI(base_url=base_url, api_key="none", http_client=http, max_retries=0)  # type: ignore[arg-type]
    return http, sdk


async def streamed(sdk: AsyncOpenAI, kind: str, text: str, **extra: Any) -> dict[str, Any]:
    common: dict[str, Any] = {
        "model": "smollm2",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "extra_body": DETERMINISTIC,
        **extra,
    }
    pieces: list[str] = []
    finish = None
    if kind == "chat":
        chat = await sdk.chat.completions.create(
            messages=[{"role": "user", "content": text}], stream=True, **common
        )
        async for chunk in chat:
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
    else:
        completion = await sdk.completions.create(prompt=text, stream=True, **common)
        async for part in completion:
            for item in part.choices:
                pieces.append(item.text)
                finish = item.finish_reason or finish
    return {"text": "".join(pieces), "finish": finish}


def hop_figures(wire: float, tokens: float, json_bytes: int, requests: int) -> dict[str, Any]:
    return {
        "requests": requests,
        "tokens": int(tokens),
        "middle_hop_codec_bytes": int(wire),
        "json_bytes_for_the_same": json_bytes,
        "codec_bytes_per_token": round(wire / max(tokens, 1), 2),
        "json_bytes_per_token": round(json_bytes / max(tokens, 1), 1),
        "json_over_codec": round(json_bytes / max(wire, 1), 1),
    }


def write_report() -> None:
    out = assets.cache_dir() / "reports" / "e2e-two-proxies.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(REPORT, indent=2, ensure_ascii=False) + "\n")


async def test_the_chain_answers_as_llama_cpp_does(llama_server: str, edge: ProxyClient) -> None:
    hop = Metrics(edge)
    direct_downloads, chain_downloads = Downloads(), Downloads()
    direct_http, direct = client_of(f"{llama_server}/v1", direct_downloads)
    chain_http, chain = client_of(f"{edge.make_url('/v1')}", chain_downloads)
    asked = [("completions", p) for p in PROMPTS[:8]] + [("chat", q) for q in QUESTIONS[:4]]
    async with direct_http, chain_http:
        for kind, text in asked:
            through = await streamed(chain, kind, text)
            straight = await streamed(direct, kind, text)
            assert through == straight, text
            assert through["finish"] in ("length", "stop")
        # Not streamed: the whole answer, rendered once the frames are all in.
        prompt = PROMPTS[0]
        whole: dict[str, Any] = {
            "model": "smollm2",
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "extra_body": DETERMINISTIC,
        }
        through_whole = await chain.completions.create(**whole)
        straight_whole = await direct.completions.create(**whole)
    assert through_whole.choices[0].text == straight_whole.choices[0].text
    assert through_whole.choices[0].finish_reason == straight_whole.choices[0].finish_reason
    wire, tokens = await hop.read()
    streamed_json = sum(r.num_bytes_downloaded for r in direct_downloads.responses[:-1])
    REPORT["default_codings"] = hop_figures(wire, tokens, direct_downloads.total, len(asked) + 1)
    REPORT["default_codings"]["json_bytes_streamed_only"] = streamed_json
    # What the edge's clients read: JSON again, made at the edge.
    REPORT["default_codings"]["edge_to_client_json_bytes"] = chain_downloads.total
    write_report()
    assert tokens > 0
    assert wire * 20 < direct_downloads.total


@pytest.mark.parametrize("coding", ["identity", "gzip", "br", "zstd"])
async def test_each_coding_on_the_middle_hop(
    llama_server: str, edge: ProxyClient, coding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The edge offers this coding only; the inner sends it (zstd with its dictionary, which the
    # edge fetched by the hash its map lists).
    monkeypatch.setattr(codec_upstream, "codec_accept_encoding", lambda *, zstd: coding)
    hop = Metrics(edge)
    direct_downloads = Downloads()
    direct_http, direct = client_of(f"{llama_server}/v1", direct_downloads)
    chain_http, chain = client_of(f"{edge.make_url('/v1')}", Downloads())
    prompts = PROMPTS[8:12]
    async with direct_http, chain_http:
        for prompt in prompts:
            through = await streamed(chain, "completions", prompt)
            assert through == await streamed(direct, "completions", prompt), prompt
    wire, tokens = await hop.read()
    REPORT[f"coding_{coding}"] = hop_figures(wire, tokens, direct_downloads.total, len(prompts))
    write_report()
    assert wire * 5 < direct_downloads.total
