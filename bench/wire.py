"""Wire bytes per token on real llama.cpp output: JSON-SSE against Codec msgpack and protobuf.

    .venv/bin/python bench/wire.py            # full: max_tokens 32, 256, 1024 x 4 prompts
    .venv/bin/python bench/wire.py --quick    # smoke: max_tokens 32 x 2 prompts

Starts the real llama.cpp server (`EmbeddedBackend`, SmolLM2-135M-Instruct Q4_1) and the proxy
in this process, then sends every prompt once per *variant*, one request at a time, at
temperature 0 with `ignore_eos` so each answer is exactly max_tokens long. A variant is one way
of fetching the same answer; it returns the body bytes it received and the tokens they carry:

- `json-direct`: `stream: true` straight to llama.cpp (what a client gets today);
- `json-proxy`: the same request through the proxy (pass-through; must equal `json-direct` except
  for the per-response `id`, `created` and `timings` values);
- `msgpack`, `protobuf`: `stream_format` through the proxy, decoded with `FrameDecoder`;
- `msgpack/event`, `protobuf/event`: offline, the `json-direct` body through the proxy's own
  transcoder one event per read: the timing-free reference for the live frame count.

Bytes are HTTP body bytes with `Accept-Encoding: identity` and no client-side decompression.
HTTP/1.1 chunked framing and response headers are counted separately (the `--` tables).
Tokens: JSON uses the response's own `usage.completion_tokens`; Codec counts the decoded IDs.

To add a column (a compressed encoding, a delta format), append a `Variant` to `variants()`:
`codec("msgpack", accept_encoding="zstd")` already works end to end once the proxy compresses.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import re
import sys
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from aiohttp import web
from tokenizers import Tokenizer

from bench._common import (
    bench_cache_dir,
    cleanup_on_exit,
    loadavg,
    machine_info,
    register_cleanup,
    results_path,
    table,
    write_results,
)
from bench.replay_upstream import split_events
from proxy import assets
from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.retokenizer import RetokenizerScheme
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.wire.decoder import FrameDecoder
from proxy.core.wire.frames import Frame, encoder_for
from proxy.embedded import EmbeddedBackend, free_port
from proxy.server import create_app
from proxy.server.process.runner import ProxyRunner
from proxy.settings import Settings
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary

LENGTHS = (32, 256, 1024)
QUICK_LENGTHS = (32,)
# Varied on purpose: prose, code, a chat-formatted prompt, and non-ASCII text (JSON escaping
# and multi-byte characters split across tokens are where formats differ most).
PROMPTS: dict[str, str] = {
    "prose": "The history of the printing press",
    "code": "def parse_config(path):\n",
    "chat": "<|im_start|>user\nExplain how rainbows form.<|im_end|>\n<|im_start|>assistant\n",
    "multilingual": "Translate into Japanese and French: Good morning, my friend! 🌅\n",
}
QUICK_PROMPTS = ("prose", "multilingual")
SEED = 7


@dataclass(frozen=True)
class Case:
    prompt_name: str
    prompt: str
    max_tokens: int

    def body(self, **extra: object) -> dict[str, object]:
        # No prompt cache and a fixed seed: every variant computes the same answer from scratch.
        # ignore_eos: llama.cpp bans end-of-generation tokens, so the answer is max_tokens long.
        return {
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "seed": SEED,
            "cache_prompt": False,
            "ignore_eos": True,
            **extra,
        }


@dataclass
class Measurement:
    """What one variant received for one case."""

    wire_bytes: int  # HTTP body bytes as received (after de-chunking, before any decoding)
    tokens: int
    text: str  # the generated text the body carries, for cross-checks between variants
    chunk_framing_bytes: int = 0  # HTTP/1.1 chunk-size lines and CRLFs around the body
    http_chunks: int = 0
    header_bytes: int = 0  # status line and response headers
    checks: dict[str, bool] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""  # kept in memory only (json-direct vs json-proxy comparison)


@dataclass
class Context:
    session: aiohttp.ClientSession
    backend_url: str
    proxy_url: str
    tokenizer: Tokenizer
    scheme: RetokenizerScheme


# (context, case, what the earlier variants of this case measured) -> measurement
Measure = Callable[[Context, Case, dict[str, Measurement]], Awaitable[Measurement]]


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    kind: Literal["json", "codec", "codec-offline"]
    measure: Measure


# --- fetching -------------------------------------------------------------------------------


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    chunk_framing_bytes: int
    http_chunks: int
    header_bytes: int
    retries: int = 0


# The proxy answers this when the upstream closed a pooled keep-alive connection just as the
# proxy reused it (llama.cpp sometimes half-closes right after a streamed response; see
# docs/BENCHMARKS.md). Nothing was generated, so the request is retried, and counted.
STALE_CONNECTION_502 = b"upstream unavailable: Server disconnected"
MAX_RETRIES = 2


async def post(
    ctx: Context, url: str, payload: dict[str, object], accept_encoding: str
) -> RawResponse:
    """POST; retry (and count) the proxy's stale-upstream-connection 502."""
    for attempt in range(MAX_RETRIES + 1):
        raw = await _post_once(ctx, url, payload, accept_encoding)
        if raw.status != 502 or STALE_CONNECTION_502 not in raw.body or attempt == MAX_RETRIES:
            raw.retries = attempt
            return raw
        print(f"    (502 stale upstream connection from {url}; retrying)")
    raise AssertionError("unreachable")


async def _post_once(
    ctx: Context, url: str, payload: dict[str, object], accept_encoding: str
) -> RawResponse:
    """POST and read the body exactly as it came, counting HTTP/1.1 chunk framing."""
    headers = {"Content-Type": "application/json", "Accept-Encoding": accept_encoding}
    async with ctx.session.post(url, data=json.dumps(payload), headers=headers) as resp:
        chunked = "chunked" in resp.headers.get("Transfer-Encoding", "").lower()
        body = bytearray()
        framing = chunks = pending = 0
        # iter_chunks() reports where each HTTP chunk ended: its size line is `<hex>\r\n` and
        # its data is followed by `\r\n`; the body ends with the `0\r\n\r\n` last-chunk.
        async for data, end_of_chunk in resp.content.iter_chunks():
            body += data
            pending += len(data)
            if chunked and end_of_chunk and pending:
                framing += len(f"{pending:x}") + 4
                chunks += 1
                pending = 0
        if chunked:
            framing += 5
        header_bytes = len(f"HTTP/1.1 {resp.status} {resp.reason}\r\n") + 2
        header_bytes += sum(len(k) + len(v) + 4 for k, v in resp.raw_headers)
        return RawResponse(
            resp.status,
            dict(resp.headers),
            bytes(body),
            framing,
            chunks,
            header_bytes,
        )


def decoded_body(raw: RawResponse) -> bytes:
    """The body with its Content-Encoding removed (identity today; ready for compression)."""
    coding = raw.headers.get("Content-Encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        return raw.body
    if coding == "gzip":
        return gzip.decompress(raw.body)
    if coding == "deflate":
        return zlib.decompress(raw.body)
    if coding == "br":
        import brotli

        data: bytes = brotli.decompress(raw.body)
        return data
    if coding == "zstd":
        import zstandard

        out: bytes = zstandard.ZstdDecompressor().decompressobj().decompress(raw.body)
        return out
    raise ValueError(f"unknown Content-Encoding {coding!r}")


# --- variants -------------------------------------------------------------------------------


def parse_sse_json(body: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of an OpenAI stream, without the `[DONE]` sentinel."""
    chunks = []
    for event in body.split(b"\n\n"):
        data = event.strip().removeprefix(b"data: ")
        if data and data != b"[DONE]":
            chunks.append(json.loads(data))
    return chunks


def json_sse(via: Literal["backend", "proxy"], *, accept_encoding: str = "identity") -> Measure:
    async def measure(ctx: Context, case: Case, earlier: dict[str, Measurement]) -> Measurement:
        base = ctx.backend_url if via == "backend" else ctx.proxy_url
        raw = await post(ctx, f"{base}/v1/completions", case.body(stream=True), accept_encoding)
        if raw.status != 200:
            raise RuntimeError(f"{via} JSON answered {raw.status}: {raw.body[:300]!r}")
        body = decoded_body(raw)
        chunks = parse_sse_json(body)
        text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        usage: dict[str, Any] = next((c["usage"] for c in reversed(chunks) if c.get("usage")), {})
        finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
        tokens = int(usage.get("completion_tokens", 0))
        return Measurement(
            wire_bytes=len(raw.body),
            tokens=tokens,
            text=text,
            chunk_framing_bytes=raw.chunk_framing_bytes,
            http_chunks=raw.http_chunks,
            header_bytes=raw.header_bytes,
            checks={
                "ended_with_DONE": body.rstrip().endswith(b"data: [DONE]"),
                "finish_reason_length": bool(finish) and finish[-1] == "length",
                "completion_tokens_eq_max_tokens": tokens == case.max_tokens,
            },
            detail={"events": len(chunks) + 1, "usage": usage, "retried_502": raw.retries},
            body=body,
        )

    return measure


def codec(
    stream_format: Literal["msgpack", "protobuf"], *, accept_encoding: str = "identity"
) -> Measure:
    async def measure(ctx: Context, case: Case, earlier: dict[str, Measurement]) -> Measurement:
        payload = case.body(stream_format=stream_format)
        raw = await post(ctx, f"{ctx.proxy_url}/v1/completions", payload, accept_encoding)
        if raw.status != 200:
            raise RuntimeError(f"Codec {stream_format} answered {raw.status}: {raw.body[:300]!r}")
        decoder = FrameDecoder(stream_format)
        frames: list[Frame] = decoder.feed(decoded_body(raw))
        decoder.flush()
        ids = [token_id for frame in frames for token_id in frame.ids]
        done = [index for index, frame in enumerate(frames) if frame.done]
        return Measurement(
            wire_bytes=len(raw.body),
            tokens=len(ids),
            text=ctx.tokenizer.decode(ids, skip_special_tokens=False),
            chunk_framing_bytes=raw.chunk_framing_bytes,
            http_chunks=raw.http_chunks,
            header_bytes=raw.header_bytes,
            checks={
                "one_done_frame_last": done == [len(frames) - 1],
                "finish_reason_length": bool(frames) and frames[-1].finish_reason == "length",
            },
            detail={
                "frames": len(frames),
                "retried_502": raw.retries,
                "ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16],
            },
        )

    return measure


def codec_one_read_per_event(stream_format: Literal["msgpack", "protobuf"]) -> Measure:
    """Codec bytes had every upstream event reached the proxy in a read of its own.

    Computed offline from the `json-direct` body with the proxy's own transcoder and encoder.
    The live proxy turns each network read into one frame, so its byte count depends on timing
    (events that arrive together share a frame); this is the timing-free reference: the most
    frames, hence the most bytes, the same upstream answer can cost.
    """

    async def measure(ctx: Context, case: Case, earlier: dict[str, Measurement]) -> Measurement:
        source = earlier["json-direct"].body
        encoder = encoder_for(stream_format)
        transcoder = CodecTranscoder(ctx.scheme, parse_completion_chunk)
        frames: list[Frame] = []
        for event in split_events(source):
            frames += transcoder.feed(event)
        frames += transcoder.flush()
        wire = b"".join(encoder.encode(frame) for frame in frames)
        ids = [token_id for frame in frames for token_id in frame.ids]
        done = [index for index, frame in enumerate(frames) if frame.done]
        return Measurement(
            wire_bytes=len(wire),
            tokens=len(ids),
            text=ctx.tokenizer.decode(ids, skip_special_tokens=False),
            chunk_framing_bytes=sum(len(f"{len(encoder.encode(f)):x}") + 4 for f in frames) + 5,
            http_chunks=len(frames),
            # The same response headers the live proxy sent for this format.
            header_bytes=earlier[stream_format].header_bytes if stream_format in earlier else 0,
            checks={"one_done_frame_last": done == [len(frames) - 1]},
            detail={"frames": len(frames)},
        )

    return measure


def variants() -> list[Variant]:
    """The columns of the report. The first JSON variant is the reference for ratios."""
    return [
        Variant("json-direct", "JSON-SSE direct", "json", json_sse("backend")),
        Variant("json-proxy", "JSON-SSE via proxy", "json", json_sse("proxy")),
        Variant("msgpack", "Codec msgpack", "codec", codec("msgpack")),
        Variant("protobuf", "Codec protobuf", "codec", codec("protobuf")),
        Variant(
            "msgpack/event",
            "Codec msgpack, one read per event (offline)",
            "codec-offline",
            codec_one_read_per_event("msgpack"),
        ),
        Variant(
            "protobuf/event",
            "Codec protobuf, one read per event (offline)",
            "codec-offline",
            codec_one_read_per_event("protobuf"),
        ),
    ]


# --- cross-checks ---------------------------------------------------------------------------

_VOLATILE = ("id", "created", "timings")


def without_volatile(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in chunk.items() if k not in _VOLATILE} for chunk in chunks]


def volatile_bytes(body: bytes) -> int:
    """Bytes of the values that legitimately differ between two identical requests."""
    pattern = rb'"(?:id":"[^"]*"|created":\d+|timings":\{[^}]*\})'
    return sum(len(m.group(0)) for m in re.finditer(pattern, body))


def cross_check(results: dict[str, Measurement], names: list[str]) -> dict[str, bool]:
    checks: dict[str, bool] = {}
    direct, proxied = results.get("json-direct"), results.get("json-proxy")
    if direct is not None and proxied is not None:
        checks["json_proxy_equals_direct_modulo_id_created_timings"] = without_volatile(
            parse_sse_json(direct.body)
        ) == without_volatile(parse_sse_json(proxied.body))
    reference = direct.text if direct is not None else None
    for name in names:
        result = results[name]
        if reference is not None and name != "json-direct":
            checks[f"{name}_text_equals_json_direct"] = result.text == reference
    return checks


# --- running --------------------------------------------------------------------------------


async def run_cases(ctx: Context, cases: list[Case], chosen: list[Variant]) -> list[dict[str, Any]]:
    records = []
    for case in cases:
        results: dict[str, Measurement] = {}
        started = time.perf_counter()
        for variant in chosen:
            results[variant.name] = await variant.measure(ctx, case, results)
        checks = cross_check(results, [v.name for v in chosen])
        for name, result in results.items():
            checks |= {f"{name}:{key}": ok for key, ok in result.checks.items()}
        failed = sorted(key for key, ok in checks.items() if not ok)
        elapsed = time.perf_counter() - started
        summary = " ".join(f"{name}={r.wire_bytes}B/{r.tokens}t" for name, r in results.items())
        status = "ok" if not failed else "CHECK FAILED: " + ", ".join(failed)
        print(f"  {case.max_tokens:>5} {case.prompt_name:<13} {summary}  [{elapsed:.1f}s] {status}")
        records.append(
            {
                "max_tokens": case.max_tokens,
                "prompt_name": case.prompt_name,
                "prompt": case.prompt,
                "variants": {
                    name: {
                        "wire_bytes": r.wire_bytes,
                        "tokens": r.tokens,
                        "chunk_framing_bytes": r.chunk_framing_bytes,
                        "http_chunks": r.http_chunks,
                        "header_bytes": r.header_bytes,
                        "volatile_bytes": volatile_bytes(r.body) if r.body else 0,
                        **r.detail,
                    }
                    for name, r in results.items()
                },
                "checks": checks,
                "failed_checks": failed,
                "seconds": round(elapsed, 2),
            }
        )
    return records


def summarize(
    records: list[dict[str, Any]], chosen: list[Variant], lengths: tuple[int, ...]
) -> list[dict[str, Any]]:
    """Per max_tokens and variant: total bytes / total tokens over the prompts."""
    rows = []
    for length in lengths:
        subset = [r for r in records if r["max_tokens"] == length]
        row: dict[str, Any] = {"max_tokens": length, "prompts": len(subset), "variants": {}}
        for variant in chosen:
            parts = [r["variants"][variant.name] for r in subset]
            wire = sum(p["wire_bytes"] for p in parts)
            framing = sum(p["chunk_framing_bytes"] for p in parts)
            headers = sum(p["header_bytes"] for p in parts)
            tokens = sum(p["tokens"] for p in parts)
            frames = sum(p.get("frames", 0) for p in parts)
            row["variants"][variant.name] = {
                "wire_bytes": wire,
                "tokens": tokens,
                "frames": frames or None,
                "ids_per_frame": tokens / frames if frames else None,
                "bytes_per_token": wire / tokens if tokens else None,
                "with_chunk_framing_per_token": (wire + framing) / tokens if tokens else None,
                "with_framing_and_headers_per_token": (
                    (wire + framing + headers) / tokens if tokens else None
                ),
            }
        rows.append(row)
    return rows


def print_tables(summary: list[dict[str, Any]], chosen: list[Variant]) -> None:
    reference = next(v for v in chosen if v.kind == "json")
    codecs = [v for v in chosen if v.kind != "json"]
    for key, title in (
        ("bytes_per_token", "Body bytes per token (identity encoding)"),
        ("with_chunk_framing_per_token", "-- plus HTTP/1.1 chunk framing, per token"),
        ("with_framing_and_headers_per_token", "-- plus framing and response headers, per token"),
    ):
        headers = ["max_tokens", *(v.name for v in chosen)]
        headers += [f"{reference.name} / {v.name}" for v in codecs]
        rows = []
        for row in summary:
            values = [row["variants"][v.name][key] for v in chosen]
            ref = row["variants"][reference.name][key]
            ratios = [ref / row["variants"][v.name][key] for v in codecs]
            rows.append([row["max_tokens"], *values, *ratios])
        print(f"\n{title}\n{table(headers, rows)}")
    frame_rows = [
        [
            row["max_tokens"],
            *(row["variants"][v.name]["frames"] for v in codecs),
            *(row["variants"][v.name]["ids_per_frame"] for v in codecs),
        ]
        for row in summary
    ]
    frame_headers = ["max_tokens", *(f"frames {v.name}" for v in codecs)]
    frame_headers += [f"IDs/frame {v.name}" for v in codecs]
    print("\nCodec frames, all prompts\n" + table(frame_headers, frame_rows))
    tokens_rows = [
        [row["max_tokens"], *(row["variants"][v.name]["tokens"] for v in chosen)] for row in summary
    ]
    print(
        "\nTokens counted (JSON: usage.completion_tokens; Codec: decoded IDs), all prompts\n"
        + table(["max_tokens", *(v.name for v in chosen)], tokens_rows)
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    gguf = assets.SMOLLM2_GGUF.ensure()
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    prompt_names = QUICK_PROMPTS if args.quick else tuple(PROMPTS)
    cases = [Case(name, PROMPTS[name], n) for n in lengths for name in prompt_names]
    chosen = variants()
    info = machine_info()
    print(f"machine: {info['nproc']} x {info['cpu_model']}, load {info['loadavg_at_start']}")
    loaded = load_tokenizer(gguf)
    vocabulary = Vocabulary.build(loaded)
    log = bench_cache_dir() / "wire-llama-server.log"
    backend = EmbeddedBackend(gguf, parallel=1, log_path=log)
    register_cleanup(backend.stop)
    print(f"starting llama.cpp ({gguf.name}), log {log}")
    backend.start(timeout=120)
    runner: web.AppRunner | None = None
    try:
        settings = Settings(upstream=(backend.url,), tokenizer=gguf, port=free_port())
        runner = ProxyRunner(
            create_app(settings, vocabulary), handler_cancellation=True, access_log=None
        )
        await runner.setup()
        await web.TCPSite(runner, settings.host, settings.port).start()
        proxy_url = f"http://{settings.host}:{settings.port}"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
        async with aiohttp.ClientSession(auto_decompress=False, timeout=timeout) as session:
            ctx = Context(session, backend.url, proxy_url, loaded.tokenizer, vocabulary.scheme)
            print(f"{len(cases)} cases x {len(chosen)} variants, one request at a time")
            records = await run_cases(ctx, cases, chosen)
    finally:
        if runner is not None:
            await runner.cleanup()
        backend.stop()
    summary = summarize(records, chosen, lengths)
    print_tables(summary, chosen)
    retries = sum(v.get("retried_502", 0) for r in records for v in r["variants"].values())
    if retries:
        print(f"\nstale-connection 502s from the proxy, retried: {retries}")
    failed = sorted({key for r in records for key in r["failed_checks"]})
    print("\nall checks passed" if not failed else f"\nFAILED CHECKS: {failed}")
    info["loadavg_at_end"] = loadavg()
    return {
        "benchmark": "wire",
        "mode": "quick" if args.quick else "full",
        "command": "python bench/" + Path(__file__).name + (" --quick" if args.quick else ""),
        "machine": info,
        "model": {"file": gguf.name, "sha256": assets.SMOLLM2_GGUF.sha256},
        "request": {k: v for k, v in Case("<prompt>", "", 0).body().items() if k not in ("prompt",)}
        | {"max_tokens": list(lengths)},
        "variants": [{"name": v.name, "label": v.label, "kind": v.kind} for v in chosen],
        "units": {
            "bytes_per_token": "HTTP body bytes (identity) / tokens",
            "tokens": "JSON: usage.completion_tokens; Codec: number of decoded IDs",
        },
        "summary": summary,
        "cases": records,
        "failed_checks": failed,
        "proxy_stale_connection_502_retries": retries,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (seconds)")
    parser.add_argument("--output", type=Path, help="results file (default bench/results/)")
    args = parser.parse_args(argv)
    with cleanup_on_exit():
        payload = asyncio.run(run(args))
    write_results(args.output or results_path("wire", quick=args.quick), payload)
    return 1 if payload["failed_checks"] else 0


if __name__ == "__main__":
    sys.exit(main())
