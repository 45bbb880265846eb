"""End to end on a real vLLM (CPU build, SmolLM2-135M): the IDs in Codec frames are the ones vLLM
sampled, as vLLM itself reports them.

Ground truth is vLLM's own JSON answer to the same request, not streamed, with
`return_token_ids: true` (greedy, a fixed seed, no prefix cache). For completions and chat,
msgpack and protobuf, Path A and Path B, answers cut by `max_tokens` (also inside a character),
ended by the end-of-turn token, and ended by a `stop` string: the frames carry vLLM's IDs, the
text the reference client `codecai` renders from them is vLLM's text, the finish reason is
vLLM's, and every stream (each one sampled) is a verification `match`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest

from proxy.core.wire import codec_pb2
from proxy.core.wire.finish import codec_finish_reason
from proxy.tokenizers.vocabulary import Vocabulary
from tests.codec_client import codecai_frames, codecai_map, render
from tests.server.conftest import AiohttpClient, ProxyClient, default_model
from tests.server.support import frames_of, ids_of
from tests.vllm.conftest import Vllm
from tests.vllm.support import PINNED, Answer, proxy_for, vllm_answer

pytestmark = pytest.mark.vllm

EOS = 2  # <|im_end|>: sampled, never rendered as text


def chat_prompt(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class Case:
    path: str
    prompt: str  # a completion's prompt, or the one user message of a chat
    max_tokens: int
    ends: str  # how vLLM ends it, checked against its answer: length, eos, stop, cut
    extra: dict[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        if self.path == "/v1/completions":
            asked: dict[str, Any] = {"prompt": self.prompt}
        else:
            asked = {"messages": [{"role": "user", "content": self.prompt}]}
        return {**PINNED, **asked, "max_tokens": self.max_tokens, **self.extra}


CASES = [
    Case("/v1/completions", "The capital of France is", 24, "length"),
    Case("/v1/completions", chat_prompt("What is 2+2?"), 48, "eos"),
    # The fourth token is the first byte of a character: never text, yet sampled.
    Case("/v1/completions", "日本の首都は", 4, "cut"),
    Case("/v1/completions", "Emoji story: 🐱 + 🐶 =", 24, "length"),
    # A stop string that is a whole token, then one that ends inside a token.
    Case("/v1/completions", "The capital of France is", 24, "stop", {"stop": [" answer"]}),
    Case("/v1/completions", "The capital of France is", 24, "stop", {"stop": ["ans"]}),
    Case("/v1/chat/completions", "What is 2+2?", 48, "eos"),
    Case("/v1/chat/completions", "Say hi.", 8, "length"),
    Case("/v1/chat/completions", "What is 2+2?", 48, "stop", {"stop": [" classic"]}),
]


def expected_ids(vocabulary: Vocabulary, answer: Answer) -> list[int]:
    """What the frames must carry, from vLLM's answer: every ID it sampled, its end-of-turn
    token included; with a stop string, the IDs whose text its answer holds (the string is not
    part of it, OpenAI's rule), the text of a token the string cut into retokenized."""
    if answer.stop_reason is None:
        return answer.token_ids
    tokenizer = vocabulary.loaded.tokenizer
    kept = 0
    while kept < len(answer.token_ids) and answer.text.startswith(
        tokenizer.decode(answer.token_ids[: kept + 1])
    ):
        kept += 1
    rest = answer.text[len(tokenizer.decode(answer.token_ids[:kept])) :]
    return answer.token_ids[:kept] + tokenizer.encode(rest, add_special_tokens=False).ids


def how_it_ended(vocabulary: Vocabulary, answer: Answer) -> str:
    """The case vLLM's answer is, as `Case.ends` names it."""
    if answer.finish_reason == "length":
        whole = vocabulary.loaded.tokenizer.decode(answer.token_ids) == answer.text
        return "length" if whole else "cut"
    assert answer.finish_reason == "stop", answer
    if answer.stop_reason is None:
        assert answer.token_ids[-1] == EOS
        return "eos"
    return "stop"


async def codec_stream(proxy: ProxyClient, path: str, **kwargs: Any) -> bytes:
    async with proxy.post(path, **kwargs) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Codec-Token-Source"] == "backend"
        return await resp.read()


async def verified(proxy: ProxyClient) -> int:
    """Streams the proxy verified as a match; none may have been a mismatch."""
    async with proxy.get("/metrics") as resp:
        page = await resp.text()
    assert 'result="mismatch"' not in page
    found = re.search(r'verify_streams_total\{model="default",result="match"\} (\S+)', page)
    return int(float(found.group(1))) if found else 0


@pytest.fixture
async def proxy(
    vllm_server: Vllm, vllm_vocabulary: Vocabulary, aiohttp_client: AiohttpClient
) -> ProxyClient:
    # Backend IDs or an error, never a quiet fall back to retokenizing; every stream verified.
    return await proxy_for(
        vllm_server, vllm_vocabulary, aiohttp_client, token_ids="backend", verify_sample_rate=1.0
    )


async def test_path_a_frames_carry_the_ids_vllm_sampled(
    proxy: ProxyClient, vllm_server: Vllm, vllm_vocabulary: Vocabulary
) -> None:
    # The drift check at start read vLLM's /v1/models: it asks vLLM for `return_token_ids`.
    assert default_model(proxy).listing.backend_kind() == "vllm"
    tokenizer_map = codecai_map(vllm_vocabulary.loaded)
    streams = 0
    for case in CASES:
        answer = await vllm_answer(vllm_server, case.path, case.body())
        assert how_it_ended(vllm_vocabulary, answer) == case.ends, (case, answer)
        for fmt in ("msgpack", "protobuf"):
            raw = await codec_stream(proxy, case.path, json={**case.body(), "stream_format": fmt})
            frames = frames_of(raw, fmt)
            assert ids_of(frames) == expected_ids(vllm_vocabulary, answer), (case, fmt)
            # A character `max_tokens` cut: its first bytes are sampled IDs, sent like any
            # other, which a client renders as one U+FFFD at the end (docs/CLIENTS.md); vLLM's
            # JSON text leaves them out.
            text = answer.text + ("\ufffd" if case.ends == "cut" else "")
            assert render(tokenizer_map, await codecai_frames(raw, fmt)) == text, case
            assert frames[-1].finish_reason == codec_finish_reason(
                answer.finish_reason, answer.stop_reason
            )
            streams += 1
    assert await verified(proxy) == streams


PATH_B_PROMPTS = ["The capital of France is", "日本の首都は"]


async def test_path_b_frames_carry_the_ids_vllm_sampled(
    proxy: ProxyClient, vllm_server: Vllm, vllm_vocabulary: Vocabulary
) -> None:
    tokenizer = vllm_vocabulary.loaded.tokenizer
    streams = 0
    for prompt in PATH_B_PROMPTS:
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        answer = await vllm_answer(
            vllm_server, "/v1/completions", {**PINNED, "prompt": prompt_ids, "max_tokens": 16}
        )
        # proto3: an absent temperature is 0.0, greedy.
        # Each body in its own encoding asks for frames in the same one.
        protobuf = codec_pb2.CodecRequest(
            prompt_ids=prompt_ids, max_tokens=16, stream_format="protobuf"
        )
        msgpack_body = msgpack.packb(
            {
                "prompt_ids": prompt_ids,
                "max_tokens": 16,
                "temperature": 0,
                "stream_format": "msgpack",
            }
        )
        for fmt, content in [
            ("protobuf", protobuf.SerializeToString()),
            ("msgpack", msgpack_body),
        ]:
            raw = await codec_stream(
                proxy,
                "/v1/completions/codec",
                data=content,
                headers={"Content-Type": f"application/x-{fmt}"},
            )
            frames = frames_of(raw, fmt)  # type: ignore[arg-type]
            assert ids_of(frames) == answer.token_ids, (prompt, fmt)
            assert frames[-1].finish_reason == codec_finish_reason(answer.finish_reason)
            streams += 1
    assert await verified(proxy) == streams
