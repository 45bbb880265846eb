"""What each way of asking the backend for token IDs costs: upstream bytes and proxy CPU per token.

    PYTHONPATH=. python bench/id_fields.py [--upstream URL] [--quick]

The proxy learns the sampled IDs from a field it adds to Codec requests
(proxy/core/http/upstream_body.py, `--backend`). This script sends the upstream body each choice
makes, built by `UpstreamRequest.body` itself, and measures what comes back:

- **llama.cpp, real**: the bundled SmolLM2-135M on the embedded llama.cpp server (started here
  unless `--upstream` names one), `/v1/completions` (chat-formatted prompts) and
  `/v1/chat/completions`, greedy, `cache_prompt: false`. Choices: nothing asked (the text is
  retokenized); both fields as the proxy asked before this script (`return_token_ids` and
  `logprobs: 1` / `logprobs: true`, which llama.cpp answers with 20 alternatives per token on
  chat); both fields now (backend unknown: chat adds `top_logprobs: 1`); llama.cpp's field only.
- **vLLM-shaped replay**: the captured vLLM stream with `return_token_ids`
  (tests/fixtures/upstream/vllm-completions-token-ids.txt), what `--backend vllm` gets; the same
  stream with the `logprobs` object vLLM adds per chunk at `logprobs: 1` (`text_offset`,
  `token_logprobs`, `tokens`, `top_logprobs`; synthesized: the token strings are the SmolLM2
  tokens, the values float32 numbers as vLLM prints them), what asking for both gets; and the
  stream with `token_ids` null, what asking for nothing gets. The backend's own cost of
  computing logprobs is not measured (no vLLM here).

Bytes per token: the upstream response body (SSE, no HTTP head) over the completion tokens
(`usage`). Proxy CPU per token: the sans-IO Codec pipeline (`CodecTranscoder` fed one SSE event
at a time, in `backend` mode when IDs were asked for, else `retokenize`, plus msgpack frame
encoding), process CPU time, best of several interleaved batches, over the same tokens. Every
ID-asking stream is checked to come out as `Codec-Token-Source: backend` with no error and the
same IDs for each choice that carries them. Nothing is asserted about timings.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import struct
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bench._common import ROOT, machine_info, results_path, table, write_results
from bench.pipeline import best_cpu_seconds
from bench.replay_upstream import split_events
from proxy import assets
from proxy.core.endpoints import CHAT, COMPLETIONS, Endpoint
from proxy.core.http.upstream_body import UpstreamRequest
from proxy.core.stream.token_source import TokenIdMode
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.wire.frames import encoder_for
from proxy.embedded import EmbeddedBackend
from proxy.tokenizers import load_tokenizer
from proxy.tokenizers.vocabulary import Vocabulary

VLLM_CAPTURE = ROOT / "tests" / "fixtures" / "upstream" / "vllm-completions-token-ids.txt"
QUESTIONS = [
    "Name a planet.",
    "What is the capital of Japan?",
    "Write one sentence about the sea.",
    "Count to five.",
]
SAMPLING = {"temperature": 0, "seed": 7, "cache_prompt": False}


@dataclass(frozen=True)
class Choice:
    name: str
    mode: TokenIdMode  # how the proxy reads the stream
    body: Callable[[UpstreamRequest], bytes]


def old_body(request: UpstreamRequest) -> bytes:
    """Both fields, as the proxy asked before `--backend` (chat: no top_logprobs)."""
    fields = json.loads(request.body(model=None, ask_for_ids=False))
    fields["return_token_ids"] = True
    fields["logprobs"] = 1 if request.endpoint == "completions" else True
    return json.dumps(fields).encode()


LLAMACPP_CHOICES = [
    Choice("nothing (retokenized)", "retokenize", lambda r: r.body(model=None, ask_for_ids=False)),
    Choice("both, as before", "backend", old_body),
    Choice(
        "both (backend unknown)",
        "backend",
        lambda r: r.body(model=None, ask_for_ids=True, backend=None),
    ),
    Choice(
        "llama.cpp's field only",
        "backend",
        lambda r: r.body(model=None, ask_for_ids=True, backend="llamacpp"),
    ),
]


@dataclass
class Measured:
    backend: str
    endpoint: str
    choice: str
    mode: TokenIdMode
    bodies: list[bytes]
    tokens: int
    ids: list[list[int]]

    @property
    def bytes_per_token(self) -> float:
        return sum(map(len, self.bodies)) / self.tokens


def completion_tokens(body: bytes) -> int:
    for event in reversed(split_events(body)):
        data = event.removeprefix(b"data: ").strip()
        if data.startswith(b"{") and (usage := json.loads(data).get("usage")):
            return int(usage["completion_tokens"])
    raise AssertionError("no usage in the stream")


def transcode(
    vocabulary: Vocabulary, endpoint: Endpoint, mode: TokenIdMode, events: list[bytes]
) -> CodecTranscoder:
    transcoder = CodecTranscoder(
        vocabulary.scheme,
        endpoint.parse_chunk,
        token_ids=mode,
        token_bytes=vocabulary.token_bytes,
    )
    encoder = encoder_for("msgpack")
    for event in events:
        frames = transcoder.feed(event)
        if frames:
            b"".join([encoder.encode(frame) for frame in frames])
    frames = transcoder.flush()
    b"".join([encoder.encode(frame) for frame in frames])
    return transcoder


def checked_ids(vocabulary: Vocabulary, endpoint: Endpoint, m: Measured) -> list[list[int]]:
    ids = []
    for body in m.bodies:
        transcoder = CodecTranscoder(
            vocabulary.scheme,
            endpoint.parse_chunk,
            token_ids=m.mode,
            token_bytes=vocabulary.token_bytes,
        )
        frames = [f for event in split_events(body) for f in transcoder.feed(event)]
        frames += transcoder.flush()
        outcome = transcoder.outcome
        assert outcome is not None, m.choice
        assert outcome.error is None, (m.choice, outcome.error)
        expected = "backend" if m.mode == "backend" else "retokenized"
        assert transcoder.token_source == expected, (m.choice, transcoder.token_source)
        ids.append([i for frame in frames for i in frame.ids])
    return ids


def post(base: str, path: str, body: bytes) -> bytes:
    request = urllib.request.Request(
        base + path, data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        raw: bytes = response.read()
        return raw


@contextmanager
def llama_server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url.rstrip("/")
        return
    with EmbeddedBackend(assets.SMOLLM2_GGUF.ensure(), parallel=1) as backend:
        yield backend.url


def measure_llamacpp(base: str, questions: list[str], max_tokens: int) -> list[Measured]:
    results = []
    requests = {
        COMPLETIONS: [
            UpstreamRequest(
                "completions",
                {
                    "prompt": f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                    "max_tokens": max_tokens,
                    **SAMPLING,
                },
            )
            for q in questions
        ],
        CHAT: [
            UpstreamRequest(
                "chat",
                {
                    "messages": [{"role": "user", "content": q}],
                    "max_tokens": max_tokens,
                    "stream_options": {"include_usage": True},
                    **SAMPLING,
                },
            )
            for q in questions
        ],
    }
    for endpoint, upstream_requests in requests.items():
        for choice in LLAMACPP_CHOICES:
            path = endpoint.paths[0]
            bodies = [post(base, path, choice.body(r)) for r in upstream_requests]
            tokens = sum(map(completion_tokens, bodies))
            results.append(
                Measured("llama.cpp", endpoint.name, choice.name, choice.mode, bodies, tokens, [])
            )
    return results


# --- vLLM-shaped replay -----------------------------------------------------------------------


def float32(value: float) -> float:
    """A float32 as Python prints it after `.item()`, as vLLM's logprobs come out."""
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


def vllm_streams(vocabulary: Vocabulary) -> dict[str, bytes]:
    # The captured response: its HTTP head, a blank line, then the SSE body.
    capture = re.split(rb"\r?\n\r?\n", VLLM_CAPTURE.read_bytes(), maxsplit=1)[1]
    rng = random.Random(7)
    with_ids: list[bytes] = []
    plain: list[bytes] = []
    both: list[bytes] = []
    offset = 0
    for event in split_events(capture):
        data = event.removeprefix(b"data: ").strip()
        if not data.startswith(b"{"):
            for out in (with_ids, plain, both):
                out.append(event)
            continue
        chunk = json.loads(data)
        # Compact, as vLLM (pydantic) writes them: the capture's own bytes come back.
        assert b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n" == event
        with_ids.append(event)
        nulled = json.loads(data)
        both_chunk = json.loads(data)
        for choice, bare, logged in zip(
            chunk["choices"], nulled["choices"], both_chunk["choices"], strict=True
        ):
            bare["token_ids"] = bare["prompt_token_ids"] = None
            ids = choice.get("token_ids") or []
            if ids:
                tokens = [vocabulary.loaded.tokenizer.decode([i]) for i in ids]
                values = [float32(-rng.expovariate(1.5)) for _ in ids]
                offsets = []
                for token in tokens:
                    offsets.append(offset)
                    offset += len(token)
                logged["logprobs"] = {
                    "text_offset": offsets,
                    "token_logprobs": values,
                    "tokens": tokens,
                    "top_logprobs": [{t: v} for t, v in zip(tokens, values, strict=True)],
                }
        for out, value in ((plain, nulled), (both, both_chunk)):
            out.append(b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n")
    return {
        "nothing (retokenized)": b"".join(plain),
        "both (`logprobs: 1` as well)": b"".join(both),
        "vLLM's field only": b"".join(with_ids),
    }


def measure_vllm(vocabulary: Vocabulary) -> list[Measured]:
    results = []
    for name, body in vllm_streams(vocabulary).items():
        mode: TokenIdMode = "retokenize" if name.startswith("nothing") else "backend"
        results.append(
            Measured(
                "vLLM (replay)", "completions", name, mode, [body], completion_tokens(body), []
            )
        )
    return results


# --- CPU and the table ------------------------------------------------------------------------


def cpu_per_token(
    vocabulary: Vocabulary, measured: list[Measured], *, repeats: int, min_seconds: float
) -> dict[int, float]:
    endpoints = {"completions": COMPLETIONS, "chat": CHAT}
    functions: dict[str, Callable[[], object]] = {}
    for index, m in enumerate(measured):
        endpoint = endpoints[m.endpoint]
        streams = [split_events(body) for body in m.bodies]

        def run(
            e: Endpoint = endpoint, s: list[list[bytes]] = streams, mode: TokenIdMode = m.mode
        ) -> None:
            for events in s:
                transcode(vocabulary, e, mode, events)

        functions[str(index)] = run
    best = best_cpu_seconds(functions, repeats=repeats, min_seconds=min_seconds)
    return {int(k): seconds / measured[int(k)].tokens * 1e6 for k, seconds in best.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", help="a running llama.cpp server (default: start one)")
    parser.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, short CPU runs")
    args = parser.parse_args(argv)
    questions = QUESTIONS[:2] if args.quick else QUESTIONS
    max_tokens = 16 if args.quick else 64
    info = machine_info()
    vocabulary = Vocabulary.build(load_tokenizer(assets.SMOLLM2_GGUF.ensure()))
    with llama_server(args.upstream) as base:
        measured = measure_llamacpp(base, questions, max_tokens)
    measured += measure_vllm(vocabulary)
    endpoints = {"completions": COMPLETIONS, "chat": CHAT}
    for m in measured:
        m.ids = checked_ids(vocabulary, endpoints[m.endpoint], m)
    # Greedy output does not depend on what is asked for; the IDs of every ID-carrying choice
    # are the same.
    for backend, endpoint in {(m.backend, m.endpoint) for m in measured}:
        group = [m for m in measured if (m.backend, m.endpoint) == (backend, endpoint)]
        assert len({m.tokens for m in group}) == 1, [(m.choice, m.tokens) for m in group]
        carrying = [m.ids for m in group if m.mode == "backend"]
        assert all(ids == carrying[0] for ids in carrying), (backend, endpoint)
    cpu = cpu_per_token(
        vocabulary,
        measured,
        repeats=3 if args.quick else 9,
        min_seconds=0.05 if args.quick else 0.5,
    )
    headers = [
        "backend",
        "endpoint",
        "asked for",
        "tokens",
        "upstream B/token",
        "proxy CPU µs/token",
    ]
    rows = [
        [m.backend, m.endpoint, m.choice, m.tokens, m.bytes_per_token, cpu[i]]
        for i, m in enumerate(measured)
    ]
    print(table(headers, rows))
    payload = {
        "machine": info,
        "questions": questions,
        "max_tokens": max_tokens,
        "rows": [dict(zip(headers, row, strict=True)) for row in rows],
    }
    write_results(results_path("id_fields", quick=args.quick), payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
