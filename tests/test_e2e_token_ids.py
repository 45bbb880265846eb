"""End to end on the real llama.cpp server (SmolLM2-135M): the model's own token IDs.

Ground truth is what the model sampled: the same request to the native `/completion`,
non-streamed, `return_tokens: true`, temperature 0, `cache_prompt: false`, same seed
(environment.md "Ground-truth IDs"). On 20 chat-formatted prompts whose answers end with the
end-of-turn token, retokenizing the streamed text cannot give the model's IDs back (that token
is sampled but never rendered); the proxy's backend mode must. The figures are written to
`.cache/reports/e2e-token-ids.json`. The proxy learns from the server's `/v1/models` (taken by
the drift check at start) that it is llama.cpp, and asks only for llama.cpp's field.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import codecai
import msgpack
import pytest

from proxy import assets
from proxy.core.http.upstream_body import UpstreamRequest
from proxy.core.wire import codec_pb2
from proxy.server import create_app
from proxy.server.models.verification import _DECODERS
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames, codecai_map, render
from tests.server.conftest import AiohttpClient, ProxyClient, default_model
from tests.server.support import frames_of, ids_of

pytestmark = pytest.mark.backend

# Found on this server: each answer ends in <|im_end|> within MAX_TOKENS, and its streamed
# logprob IDs cover its text (no multi-byte character).
QUESTIONS = [
    "Say hi.",
    "What is 2+2?",
    "What is the capital of Italy?",
    "Say yes or no.",
    "Give me one word.",
    "Count to three.",
    "What day comes after Monday?",
    "Name a fruit.",
    "What is 10 minus 3?",
    "Name a planet.",
    "What is the largest ocean?",
    "Translate 'hello' to Spanish.",
    "How many legs does a dog have?",
    "What is the square root of 9?",
    "What is the first letter of the alphabet?",
    "Hello!",
    "What is the capital of Japan?",
    "How many days are in a week?",
    "What color is the sun?",
    "Good morning!",
]
MAX_TOKENS = 48
EOS = 2
ASKED = ("return_token_ids", "logprobs", "top_logprobs", "n_probs")


def chat_prompt(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def sampling(**extra: Any) -> dict[str, Any]:
    return {"temperature": 0, "seed": 7, "cache_prompt": False, **extra}


async def model_ids(base: str, prompt: str | list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
    body = sampling(prompt=prompt, n_predict=max_tokens, return_tokens=True)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/completion", json=body) as resp:
            assert resp.status == 200
            tokens: list[int] = (await resp.json())["tokens"]
    return tokens


async def direct_text(base: str, path: str, body: dict[str, Any]) -> str:
    """The generated text a JSON client gets for the same request."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}{path}", json={**body, "stream": True}) as resp:
            assert resp.status == 200
            raw = await resp.read()
    text = []
    for event in raw.split(b"\n\n"):
        data = event.removeprefix(b"data: ").strip()
        if data and data != b"[DONE]" and (choices := json.loads(data)["choices"]):
            choice = choices[0]
            text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(text)


async def codec(
    proxy: ProxyClient, path: str, fmt: str = "msgpack", **kwargs: Any
) -> tuple[str, list[int], bytes]:
    async with proxy.post(path, **kwargs) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
        source = resp.headers["Codec-Token-Source"]
    return source, ids_of(frames_of(raw, fmt)), raw  # type: ignore[arg-type]


@pytest.fixture
def sent_fields(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The ID and probability fields of every Codec request body sent upstream."""
    sent: list[dict[str, Any]] = []
    real = UpstreamRequest.body

    def body(self: UpstreamRequest, **kwargs: Any) -> bytes:
        raw = real(self, **kwargs)
        fields = json.loads(raw)
        sent.append({name: fields[name] for name in ASKED if name in fields})
        return raw

    monkeypatch.setattr(UpstreamRequest, "body", body)
    return sent


@pytest.fixture
async def make_real_proxy(
    llama_server: str, smollm2_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> Any:
    async def make(mode: str, vocabulary: Vocabulary | None = None, **changes: Any) -> ProxyClient:
        vocabulary = vocabulary or smollm2_vocabulary
        settings = pinned_draws.settings(
            upstream=(llama_server,),
            tokenizer=vocabulary.loaded.source,
            token_ids=mode,
            **changes,
        )
        proxy = await aiohttp_client(create_app(settings, vocabulary))
        digest = default_model(proxy).published.digest
        for _ in range(3000):  # a verified stream needs the map's decoder, built off the loop
            if not settings.verify_sample_rate or digest in _DECODERS:
                break
            await asyncio.sleep(0.01)
        return proxy

    return make


async def test_backend_ids_match_the_model_where_retokenizing_cannot(
    make_real_proxy: Any,
    llama_server: str,
    smollm2_vocabulary: Vocabulary,
    sent_fields: list[dict[str, Any]],
) -> None:
    backend = await make_real_proxy("backend")
    # The drift check at start read /v1/models: only llama.cpp's field is asked for.
    assert default_model(backend).listing.backend_kind() == "llamacpp"
    retokenize = await make_real_proxy("retokenize")
    tokenizer_map = codecai_map(smollm2_vocabulary.loaded)
    report: dict[str, list[dict[str, Any]]] = {"eos_prompts": []}
    for index, question in enumerate(QUESTIONS):
        fmt = "protobuf" if index % 2 else "msgpack"
        prompt = chat_prompt(question)
        truth = await model_ids(llama_server, prompt)
        body = sampling(prompt=prompt, max_tokens=MAX_TOKENS, stream_format=fmt)
        source, ours, raw = await codec(backend, "/v1/completions", fmt, json=body)
        _, retokenized, _ = await codec(retokenize, "/v1/completions", fmt, json=body)
        assert source == "backend"
        assert sent_fields[-2:] == [{"logprobs": 1}, {}]  # the backend proxy's, retokenize's
        assert ours == truth, question
        assert truth[-1] == EOS
        assert retokenized != truth, question
        # What codecai renders is the model's text (the end-of-turn token renders as nothing).
        text = smollm2_vocabulary.loaded.tokenizer.decode(truth, skip_special_tokens=True)
        assert render(tokenizer_map, await codecai_frames(raw, fmt)) == text
        report["eos_prompts"].append({"prompt": question, "tokens": len(truth)})
    # The general prompts (backend against retokenized IDs there) are measured by
    # tests/test_e2e_llamacpp.py, which already asks the model for its IDs.
    summary = {"eos_prompts": {"backend_matches": len(QUESTIONS), "retokenized_matches": 0}}
    out = assets.cache_dir() / "reports" / "e2e-token-ids.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"summary": summary, **report}, indent=2, ensure_ascii=False))


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "unreported"),
    [
        ("Emoji story: 🐱 + 🐶 =", 24, 0),  # each emoji: only its last byte token reported
        ("日本の首都は", 4, 1),  # max_tokens cuts a character: its first byte never arrives
    ],
)
async def test_under_reported_spans_are_retokenized_on_the_real_server(
    make_real_proxy: Any, llama_server: str, prompt: str, max_tokens: int, unreported: int
) -> None:
    proxy = await make_real_proxy("backend")
    truth = await model_ids(llama_server, prompt, max_tokens)
    body = sampling(prompt=prompt, max_tokens=max_tokens, stream_format="msgpack")
    source, ours, _ = await codec(proxy, "/v1/completions", json=body)
    assert source == "backend"
    # Every reported ID that checks out is kept; each emoji span is retokenized, which gives
    # back what the model sampled; the cut character's byte was never sent at all.
    assert ours == truth[: len(truth) - unreported]


async def test_path_b_on_the_real_server(
    make_real_proxy: Any, llama_server: str, smollm2_vocabulary: Vocabulary
) -> None:
    proxy = await make_real_proxy("auto")
    prompt_ids = smollm2_vocabulary.loaded.tokenizer.encode(
        "The capital of France is", add_special_tokens=False
    ).ids
    truth = await model_ids(llama_server, prompt_ids, 16)
    request = codec_pb2.CodecRequest(prompt_ids=prompt_ids, max_tokens=16)
    source, ours, _ = await codec(
        proxy,
        "/v1/completions/codec",
        data=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    # proto3: an absent temperature is 0.0, greedy, so the model's own IDs come back.
    assert source == "backend"
    assert ours == truth
    body = msgpack.packb({"prompt_ids": prompt_ids, "max_tokens": 16, "temperature": 0})
    _, again, _ = await codec(
        proxy,
        "/v1/completions/codec",
        data=body,
        headers={"Content-Type": "application/x-msgpack"},
    )
    assert again == truth


async def test_chat_on_the_real_server(
    make_real_proxy: Any,
    llama_server: str,
    smollm2_vocabulary: Vocabulary,
    sent_fields: list[dict[str, Any]],
) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    body = sampling(messages=messages, max_tokens=32)
    text = await direct_text(llama_server, "/v1/chat/completions", body)
    for mode, fmt in [("auto", "msgpack"), ("retokenize", "protobuf")]:
        proxy = await make_real_proxy(mode)
        source, ours, raw = await codec(
            proxy, "/v1/chat/completions", fmt, json={**body, "stream_format": fmt}
        )
        assert source == ("backend" if mode == "auto" else "retokenized")
        # One alternative per token, not llama.cpp's default 20 (docs/BENCHMARKS.md).
        assert sent_fields[-1] == ({"logprobs": True, "top_logprobs": 1} if mode == "auto" else {})
        rendered = render(codecai_map(smollm2_vocabulary.loaded), await codecai_frames(raw, fmt))
        assert rendered == text
        assert smollm2_vocabulary.loaded.tokenizer.decode(ours) == text


# OpenAI's `stop`: the matched stop string is not part of the answer. llama.cpp reports its
# token in a chunk with text "" (" has", "," below) or with the text before it (" " of " ==").
STOPS = [
    ("The capital of France is", " has"),
    ("The United States of America is", ","),
    ("if x == 1:\n    print(x)\nelif x", "=="),
]


async def test_a_stop_string_is_not_part_of_a_codec_answer(
    make_real_proxy: Any, llama_server: str, smollm2_vocabulary: Vocabulary
) -> None:
    proxy = await make_real_proxy("auto", verify_sample_rate=1.0)
    tokenizer_map = codecai_map(smollm2_vocabulary.loaded)
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    streams = 0
    for prompt, stop in STOPS:
        completions = sampling(prompt=prompt, max_tokens=24, stop=[stop])
        messages = [{"role": "user", "content": prompt}]
        chat = sampling(messages=messages, max_tokens=24, stop=[stop])
        for path, body in [("/v1/completions", completions), ("/v1/chat/completions", chat)]:
            answer = await direct_text(llama_server, path, body)
            for fmt in ("msgpack", "protobuf"):
                source, _, raw = await codec(proxy, path, fmt, json={**body, "stream_format": fmt})
                assert source == "backend"
                assert render(tokenizer_map, await codecai_frames(raw, fmt)) == answer, (path, stop)
                streams += 1
        # Path B: the same prompt as IDs, its `stop` in the CodecRequest.
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        answer = await direct_text(
            llama_server, "/v1/completions", {**completions, "prompt": prompt_ids}
        )
        request = {"prompt_ids": prompt_ids, "max_tokens": 24, "temperature": 0, "stop": [stop]}
        _, _, raw = await codec(
            proxy,
            "/v1/completions/codec",
            data=msgpack.packb(request),
            headers={"Content-Type": "application/x-msgpack"},
        )
        assert render(tokenizer_map, await codecai_frames(raw, "msgpack")) == answer, stop
        streams += 1
    # Every stream was verified, and the verifier agrees: no critical alert on stop strings.
    async with proxy.get("/metrics") as resp:
        metrics = await resp.text()
    assert f'codec_proxy_verify_streams_total{{model="default",result="match"}} {streams}.0' in (
        metrics
    )
    assert 'result="mismatch"' not in metrics


# llama.cpp refuses `logprobs` with `tools` in a stream, so a chat request that carries a tools
# array gets no IDs from it: any client can have its text retokenized that way.
TOOLS = [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]


async def codec_text(proxy: ProxyClient, body: dict[str, Any], fmt: str) -> tuple[str, str]:
    """What codecai shows of a Codec chat stream, read with the map the proxy publishes."""
    source, _, raw = await codec(
        proxy, "/v1/chat/completions", fmt, json={**body, "stream_format": fmt}
    )
    published = codecai.TokenizerMap.from_json(default_model(proxy).published.body)
    return source, render(published, await codecai_frames(raw, fmt))


async def verified_matches(proxy: ProxyClient) -> int:
    async with proxy.get("/metrics") as resp:
        metrics = await resp.text()
    assert 'result="mismatch"' not in metrics
    match = re.search(r'verify_streams_total\{model="default",result="match"\} (\d+)', metrics)
    return int(match.group(1)) if match else 0


async def test_chat_with_tools_is_retokenized_to_the_json_text(
    make_real_proxy: Any, llama_server: str, sent_fields: list[dict[str, Any]]
) -> None:
    proxy = await make_real_proxy("auto", verify_sample_rate=1.0)
    questions = ["What is the capital of France?", "Say: na\u0308ive re\u0301sume\u0301"]
    for index, question in enumerate(questions):
        body = sampling(messages=[{"role": "user", "content": question}], tools=TOOLS)
        body["max_tokens"] = 32
        answer = await direct_text(llama_server, "/v1/chat/completions", body)
        source, shown = await codec_text(proxy, body, "protobuf" if index else "msgpack")
        assert sent_fields[-1] == {}  # nothing asked for: llama.cpp would refuse the request
        assert (source, shown) == ("retokenized", answer)
    assert await verified_matches(proxy) == len(questions)


@pytest.mark.parametrize(
    ("tokenizer", "question", "trap"),
    [
        # Qwen3 normalizes to NFC: "a" + U+0308 would come back as "ä".
        (assets.QWEN3_TOKENIZER, "Say: na\u0308ive re\u0301sume\u0301", "a\u0308"),
        # SentencePiece (Mistral) reads a literal "▁" as a space.
        (assets.MISTRAL_TOKENIZER, "Repeat exactly: a\u2581b \u2581\u2581 c\u2581d", "\u2581"),
    ],
    ids=["qwen3-nfc", "mistral-metaspace"],
)
async def test_retokenized_text_a_tokenizer_would_change_is_the_json_text(
    make_real_proxy: Any, llama_server: str, tokenizer: Any, question: str, trap: str
) -> None:
    # The same real server behind a proxy that serves another family's tokenizer (the drift
    # check would refuse it, so it is off): text that tokenizer would give back otherwise,
    # as a client forcing retokenization with `tools` can have the model write it.
    vocabulary = Vocabulary.build(load_tokenizer(tokenizer.ensure()))
    proxy = await make_real_proxy("auto", vocabulary, verify_sample_rate=1.0, drift_check=False)
    body = sampling(messages=[{"role": "user", "content": question}], tools=TOOLS)
    body["max_tokens"] = 24
    answer = await direct_text(llama_server, "/v1/chat/completions", body)
    assert trap in answer  # the model wrote the trap
    source, shown = await codec_text(proxy, body, "msgpack")
    assert source == "retokenized"
    # A SentencePiece map: codecai keeps the space SentencePiece prepends to a text.
    assert shown in (answer, " " + answer)
    assert await verified_matches(proxy) == 1
