"""llama.cpp's slots, for the tests that show a request the proxy gave up on stops generating.

What "stopped" means is relative to the work left: llama.cpp frees a slot at its next token once
the connection is closed, and otherwise only when the request is done. A request's tokens are
capped by the slot's context (`n_ctx`: 1024 with the test server's 4096 over four slots,
whatever `max_tokens` says), so the work left is measured, not assumed: the seconds per token
this backend takes right now, times the tokens the request could still ask for.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

# Longer than any prompt these tests send, in tokens: what the context holds besides the answer.
PROMPT_ALLOWANCE = 64
CALIBRATION_TOKENS = 64


async def slots(base: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/slots") as resp:
            assert resp.status == 200
            answer: list[dict[str, Any]] = await resp.json()
    return answer


async def busy_slots(base: str) -> int:
    return sum(bool(slot["is_processing"]) for slot in await slots(base))


async def wait_idle(base: str, within: float) -> float:
    """Seconds until no slot is processing; fails after `within`."""
    started = time.monotonic()
    while await busy_slots(base):
        assert time.monotonic() - started < within, (
            f"llama.cpp is still generating after {within:.1f} s"
        )
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def seconds_per_token(base: str) -> float:
    """How long the idle backend takes per generated token now (prefill and HTTP included, so
    a little more than the decoding alone)."""
    body = {
        "prompt": "Tell a story.",
        "max_tokens": CALIBRATION_TOKENS,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/v1/completions", json=body) as resp:
            assert resp.status == 200
            answer = await resp.json()
    took = time.monotonic() - started
    assert answer["usage"]["completion_tokens"] == CALIBRATION_TOKENS
    return took / CALIBRATION_TOKENS


async def generation_seconds(base: str, max_tokens: int) -> float:
    """How long the backend would take, at its speed now, to generate all the tokens a request
    with `max_tokens` can get (capped by a slot's context). Call it with the backend idle."""
    n_ctx = min(int(slot["n_ctx"]) for slot in await slots(base))
    tokens = min(max_tokens, n_ctx - PROMPT_ALLOWANCE)
    return tokens * await seconds_per_token(base)


async def idle_long_before_done(base: str, full: float, began: float) -> float:
    """Seconds until the backend is idle, called once the proxy has given up on a request that
    began at `began` (monotonic) and would take `full` seconds in all: within half the time the
    rest of it would take, or the backend went on generating."""
    left = full - (time.monotonic() - began)
    assert left > 1.0, f"only {left:.1f} s of generation left: too little to tell a stop apart"
    return await wait_idle(base, left / 2)
