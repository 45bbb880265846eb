"""End to end on the real llama.cpp server: a `stop` cancels the generation upstream.

The proxy must not drain a stopped stream: it closes the upstream connection, llama.cpp notices
at its next token and frees the slot. Observed through llama.cpp's own `/slots` endpoint: every
slot is idle after the client's response ends in less than half the time the rest of the
request would have taken (tests/llama_slots.py measures it), while the request asked for far more
tokens than were generated.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames
from tests.core.safety.support import descriptor
from tests.llama_slots import generation_seconds, idle_long_before_done, wait_idle
from tests.server.conftest import AiohttpClient, ProxyClient
from tests.server.policy_support import v04

pytestmark = pytest.mark.backend

# More than a slot's context holds (1024): the request could run until the context is full.
MAX_TOKENS = 4000
PROMPT = "Once upon a time, in a land far away, there lived a"


def stop_on_common_words(path: Path) -> Path:
    doc = descriptor(common="stop")
    document: dict[str, Any] = {
        "descriptor": doc,
        "rules": {"regexes": [{"category": "common", "pattern": r"\b(?:the|a|and)\b"}]},
    }
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
async def policed_real(
    llama_server: str,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
) -> ProxyClient:
    settings = pinned_draws.settings(
        upstream=(llama_server,),
        tokenizer=smollm2_vocabulary.loaded.source,
        safety_policy=stop_on_common_words(tmp_path / "policy.json"),
    )
    return await aiohttp_client(create_app(settings, smollm2_vocabulary))


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
async def test_stop_frees_the_llamacpp_slot(
    policed_real: ProxyClient, llama_server: str, fmt: str
) -> None:
    await wait_idle(llama_server, 30.0)  # nothing left over from earlier tests
    full = await generation_seconds(llama_server, MAX_TOKENS)
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    body |= {"stream": True} if fmt == "json" else {"stream_format": fmt}
    began = time.monotonic()
    async with policed_real.post("/v1/completions", json=body, headers=v04()) as resp:
        assert resp.status == 200
        raw = await resp.read()
    if fmt == "json":
        events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
        assert events[-1] == b"[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "content_filter"
        generated = len(events)
    else:
        frames = await codecai_frames(raw, fmt)
        assert frames[-1].finish_reason == "policy_violation"
        generated = sum(len(f.ids) for f in frames)
    # The stop came early: the backend had thousands of tokens still to generate...
    assert generated < 200
    # ...and stopped generating them: its slot is idle long before they could have been.
    await idle_long_before_done(llama_server, full, began)
