"""`codec-proxy client`: stream one completion through the proxy as Codec and show what it cost.

It decodes the frames with our own `FrameDecoder`, turns IDs back into text with the model's
tokenizer as they arrive, then prints one summary line comparing the Codec wire bytes with the
same answer as JSON-SSE (fetched with a second, identical request unless --no-compare).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import aiohttp
from tokenizers.decoders import DecodeStream

from proxy.core.wire.decoder import FrameDecoder


def _tokenizer_path(args: argparse.Namespace) -> Path:
    if args.tokenizer is not None:
        return Path(args.tokenizer)
    from proxy import assets

    bundled = assets.SMOLLM2_GGUF.path
    if not bundled.exists():
        raise SystemExit("codec-proxy client: pass --tokenizer (the backend model's tokenizer)")
    return bundled


async def run_client(args: argparse.Namespace) -> int:
    from proxy.tokenizers import TokenizerLoadError, load_tokenizer

    try:
        tokenizer = load_tokenizer(_tokenizer_path(args)).tokenizer
    except TokenizerLoadError as exc:
        raise SystemExit(f"codec-proxy client: {exc.message}") from exc
    body = {
        "prompt": args.prompt,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream_format": args.format,
    }
    url = args.url.rstrip("/") + "/v1/completions"
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        started = time.perf_counter()
        async with session.post(url, json=body, headers={"Accept-Encoding": "identity"}) as resp:
            if resp.status != 200:
                print(f"HTTP {resp.status}: {await resp.text()}", file=sys.stderr)
                return 1
            decoder = FrameDecoder(args.format)
            text = DecodeStream(skip_special_tokens=True)
            wire = tokens = 0
            first_token_at: float | None = None
            finish = None
            async for chunk in resp.content.iter_any():
                wire += len(chunk)
                for frame in decoder.feed(chunk):
                    if frame.ids and first_token_at is None:
                        first_token_at = time.perf_counter()
                    for token_id in frame.ids:
                        piece = text.step(tokenizer, token_id)
                        if piece:
                            print(piece, end="", flush=True)
                    tokens += len(frame.ids)
                    if frame.done:
                        finish = frame.finish_reason
            decoder.flush()
        elapsed = time.perf_counter() - started
        print()
        json_bytes = None if args.no_compare else await _json_sse_bytes(session, url, body)
    ttft = f"{(first_token_at - started) * 1000:.0f} ms" if first_token_at else "n/a"
    summary = (
        f"[{args.format}] {tokens} tokens, {wire} wire bytes "
        f"({wire / max(tokens, 1):.1f} B/token), "
        f"finish {finish}, first token {ttft}, total {elapsed * 1000:.0f} ms"
    )
    if json_bytes is not None:
        summary += (
            f"; as JSON-SSE: {json_bytes} bytes ({json_bytes / max(tokens, 1):.1f} B/token, "
            f"{json_bytes / max(wire, 1):.1f}x more)"
        )
    print(summary)
    return 0


async def _json_sse_bytes(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> int:
    plain = {k: v for k, v in body.items() if k != "stream_format"} | {"stream": True}
    data = json.dumps(plain).encode()
    headers = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
    async with session.post(url, data=data, headers=headers) as resp:
        return len(await resp.read())
