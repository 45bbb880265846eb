"""End to end: the proxy in front of the real llama.cpp server running SmolLM2-135M.

For 20 varied prompts at temperature 0, the text the reference client `codecai` renders from
the proxy's Codec stream equals the text of a direct JSON-SSE request. The proxy's IDs are also
compared with the IDs the model sampled (llama.cpp `logprobs`); every difference must be a
different tokenization of the same text, and the match rate is written to
`.cache/reports/e2e-id-match.json` for the record.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from tokenizers import Tokenizer

from proxy import assets
from proxy.core.stream.token_source import TokenIdMode
from proxy.embedded import free_port
from proxy.server import create_app
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames, codecai_map, render
from tests.server.conftest import AiohttpClient, ProxyClient

pytestmark = pytest.mark.backend

PROMPTS = [
    "The capital of France is",
    "Write a Python function that reverses a string:\n```python\n",
    "List three primary colors:\n1.",
    "Translate to French: Good morning, how are you?",
    "2 + 2 =",
    "The year 1969 was important because",
    "<|im_start|>user\nWhat is the tallest mountain?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a land far away,",
    '{"name": "Alice", "age":',
    "Q: What's the boiling point of water?\nA:",
    "def fibonacci(n):",
    "Emoji story: 🐱 + 🐶 =",
    "日本の首都は",
    "The quick brown fox",
    "Here is a haiku about autumn:\n",
    "SELECT name FROM users WHERE",
    "    indented code block with    multiple   spaces",
    "<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n",
    "Step 1: Preheat the oven to 350°F.\nStep 2:",
    "Dear Sir or Madam,\n\nI am writing to",
]
MAX_TOKENS = 48


def request_body(prompt: str, **extra: object) -> dict[str, object]:
    # No prompt cache and a fixed seed: both requests compute the same logits from scratch.
    return {
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "seed": 7,
        "cache_prompt": False,
        **extra,
    }


async def direct_stream(base: str, prompt: str) -> str:
    """Generated text of a direct JSON-SSE request, as a JSON client sees it."""
    body = request_body(prompt, stream=True)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/v1/completions", json=body) as resp:
            assert resp.status == 200
            raw = await resp.read()
    text = []
    for event in raw.split(b"\n\n"):
        data = event.removeprefix(b"data: ").strip()
        if data and data != b"[DONE]":
            text.append(json.loads(data)["choices"][0]["text"])
    return "".join(text)


async def sampled_ids(base: str, prompt: str) -> list[int]:
    """The IDs the model sampled for the same request.

    llama.cpp's *streamed* `logprobs` (and native `tokens`) leave out the tokens of a character
    whose UTF-8 bytes span several tokens: the chunk that completes it reports only its last
    token. The non-streamed native endpoint reports all of them, so it is the ground truth.
    """
    body = {k: v for k, v in request_body(prompt).items() if k != "max_tokens"}
    body |= {"n_predict": MAX_TOKENS, "return_tokens": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/completion", json=body) as resp:
            assert resp.status == 200
            tokens: list[int] = (await resp.json())["tokens"]
    return tokens


def mismatch_class(tokenizer: Tokenizer, ours: list[int], model: list[int], text: str) -> str:
    """Why retokenizing the streamed text cannot give back the sampled IDs."""
    if tokenizer.decode(model, skip_special_tokens=False) == text:
        return "non-canonical tokenization of the same text"
    rendered = tokenizer.decode(model, skip_special_tokens=True)
    if rendered == text:
        return "special token sampled but not rendered in the text (EOS)"
    if rendered.startswith(text) and set(rendered[len(text) :]) <= {"\ufffd"}:
        return "incomplete UTF-8 at max_tokens, never sent as text"
    raise AssertionError(f"unexplained mismatch: {ours} vs {model} for {text!r}")


async def proxy_with(
    token_ids: TokenIdMode, llama_server: str, vocabulary: Vocabulary, client: AiohttpClient
) -> ProxyClient:
    settings = pinned_draws.settings(
        upstream=(llama_server,), tokenizer=vocabulary.loaded.source, token_ids=token_ids
    )
    return await client(create_app(settings, vocabulary))


@pytest.fixture
async def real_proxy(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    # These tests measure the retokenizer; backend IDs are compared below and in
    # tests/test_e2e_token_ids.py.
    return await proxy_with("retokenize", llama_server, smollm2_vocabulary, aiohttp_client)


@pytest.fixture
async def backend_proxy(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    return await proxy_with("backend", llama_server, smollm2_vocabulary, aiohttp_client)


async def test_codec_text_equals_direct_json_text_on_20_prompts(
    real_proxy: ProxyClient,
    backend_proxy: ProxyClient,
    llama_server: str,
    smollm2_vocabulary: Vocabulary,
) -> None:
    tokenizer_map = codecai_map(smollm2_vocabulary.loaded)
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    report = []
    for index, prompt in enumerate(PROMPTS):
        fmt = "protobuf" if index % 2 else "msgpack"
        expected_text = await direct_stream(llama_server, prompt)
        model_ids = await sampled_ids(llama_server, prompt)
        body = request_body(prompt, stream_format=fmt)
        async with real_proxy.post("/v1/completions", json=body) as resp:
            assert resp.status == 200
            frames = await codecai_frames(await resp.read(), fmt)
        assert frames[-1].done
        assert frames[-1].finish_reason in ("length", "eos_token")
        assert render(tokenizer_map, frames) == expected_text, prompt
        ours = [i for f in frames for i in f.ids]
        assert ours == tokenizer.encode(expected_text, add_special_tokens=False).ids
        same = ours == model_ids
        backend_body = request_body(prompt, stream_format="msgpack")
        async with backend_proxy.post("/v1/completions", json=backend_body) as resp:
            backend = [i for f in await codecai_frames(await resp.read(), "msgpack") for i in f.ids]
        if backend != model_ids:
            # Only the tail llama.cpp never sends: the bytes of a character max_tokens cut.
            assert model_ids[: len(backend)] == backend, prompt
            tail = smollm2_vocabulary.token_bytes.render(model_ids[len(backend) :])
            assert tail is not None
            with pytest.raises(UnicodeDecodeError):
                b"".join(tail).decode()
        report.append(
            {
                "prompt": prompt,
                "format": fmt,
                "ids_identical": same,
                "backend_ids_identical": backend == model_ids,
                "mismatch": None
                if same
                else mismatch_class(tokenizer, ours, model_ids, expected_text),
                "model_pieces": None if same else [tokenizer.id_to_token(i) for i in model_ids],
                "proxy_pieces": None if same else [tokenizer.id_to_token(i) for i in ours],
            }
        )
    matched = sum(bool(r["ids_identical"]) for r in report)
    backend_matched = sum(bool(r["backend_ids_identical"]) for r in report)
    classes = Counter(str(r["mismatch"]) for r in report if r["mismatch"])
    out = assets.cache_dir() / "reports" / "e2e-id-match.json"
    out.parent.mkdir(exist_ok=True)
    summary = {
        "streams": len(report),
        "identical": matched,
        "backend_identical": backend_matched,
        "mismatch_classes": classes,
    }
    out.write_text(
        json.dumps({"summary": summary, "streams": report}, indent=2, ensure_ascii=False)
    )
    # Most streams must match exactly: a broken retokenizer would not get close.
    assert matched >= len(PROMPTS) // 2
    # The backend's own IDs are never worse than retokenized text.
    assert backend_matched >= matched


async def test_json_passthrough_matches_direct_on_the_real_server(
    real_proxy: ProxyClient,
    llama_server: str,
) -> None:
    # Deterministic endpoints: byte-identical bodies.
    for method, path, payload in [
        ("POST", "/tokenize", {"content": "Hello 世界 🎉", "add_special": False}),
        ("GET", "/v1/models", None),
        ("GET", "/health", None),
    ]:
        async with real_proxy.request(method, path, json=payload) as resp:
            via_proxy = (resp.status, await resp.read())
        async with aiohttp.ClientSession() as session:
            async with session.request(method, llama_server + path, json=payload) as resp:
                straight = (resp.status, await resp.read())
        assert via_proxy[0] == straight[0]
        assert hashlib.sha256(via_proxy[1]).digest() == hashlib.sha256(straight[1]).digest(), path
    # A generated stream differs only in per-request fields (id, created, timings).
    body = request_body("The capital of France is", stream=True)
    async with real_proxy.post("/v1/completions", json=body) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        via_proxy_stream = await resp.read()
    async with aiohttp.ClientSession() as session:
        async with session.post(llama_server + "/v1/completions", json=body) as resp:
            straight_stream = await resp.read()
    assert _stable(via_proxy_stream) == _stable(straight_stream)


def _stable(sse: bytes) -> list[object]:
    events = []
    for event in sse.split(b"\n\n"):
        data = event.removeprefix(b"data: ").strip()
        if data and data != b"[DONE]":
            chunk = json.loads(data)
            for volatile in ("id", "created", "timings", "usage"):
                chunk.pop(volatile, None)
            events.append(chunk)
    return events


def test_cli_serve_and_client(llama_server: str, smollm2_gguf: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    serve = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--upstream", llama_server,
         "--tokenizer", str(smollm2_gguf), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        # Log lines (the drift check at start) come before the banner on the merged output.
        lines: list[str] = []
        while len(lines) < 20 and not (lines and lines[-1].startswith("codec-proxy ")):
            lines.append(serve.stdout.readline())
        banner = lines[-1]
        assert f"http://127.0.0.1:{port}" in banner
        assert any("probe strings tokenize identically" in line for line in lines)
        result = subprocess.run(
            [sys.executable, "-m", "proxy", "client", "--url", f"http://127.0.0.1:{port}",
             "--tokenizer", str(smollm2_gguf), "--max-tokens", "16", "The capital of France is"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
    finally:
        serve.terminate()
        serve.wait(10)
        if serve.stdout is not None:
            serve.stdout.close()
    assert result.returncode == 0, result.stderr
    text, summary = result.stdout.rstrip("\n").rsplit("\n", 1)
    assert "Paris" in text
    assert summary.startswith("[msgpack] 16 tokens")
    assert "as JSON-SSE" in summary


def test_embedded_serves_and_ctrl_c_stops_both(smollm2_gguf: Path) -> None:
    """`make run`'s command: a real llama.cpp server plus the proxy; SIGINT stops both."""
    port, backend_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "embedded", "--port", str(port),
         "--backend-port", str(backend_port), "--model-file", str(smollm2_gguf)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = "".join(proc.stdout.readline() for _ in range(3))
        assert f"http://127.0.0.1:{port}" in banner
        body = json.dumps({"prompt": "Hello", "max_tokens": 4, "stream_format": "msgpack"})
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body.encode())
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.headers["Content-Type"] == "application/x-msgpack"
            assert resp.read().endswith(b"length")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    for stopped in (port, backend_port):
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", stopped)) != 0, f"port {stopped} still open"
