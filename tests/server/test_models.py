"""Several models behind one proxy, each in front of its own fake backend.

Two tokenizer families (SmolLM2 and Qwen3) so that a map or a dictionary taken from the wrong
model shows: the IDs of one decode to other text with the other's map. Most routing tests use
two SmolLM2 models instead, which are cheaper to build (Qwen3's map is 4.7 MB to render).

Every fake records what reaches it, so "before any upstream contact" is checked on all of them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import codecai
import msgpack
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from proxy import assets, config
from proxy.cli import run_worker
from proxy.core.compression.dictionaries import DictionaryError
from proxy.core.errors import ConfigError
from proxy.embedded import free_port
from proxy.server import create_app
from proxy.server.models.served_models import SERVED_MODELS, ServedModel
from proxy.settings import DEFAULT_DICTIONARIES_MANIFEST, ModelSettings, Settings
from proxy.tokenizers import LoadedTokenizer, TokenizerLoadError
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.codec_client import codecai_frames
from tests.compression_support import decompress_whole
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import (
    AiohttpClient,
    AiohttpServer,
    ProxyClient,
    app_of,
)
from tests.server.support import frames_of

SMOL_CAPTURE = "llamacpp-completions-sample.txt"
# Another stream, so that which backend answered shows in the text.
QWEN_CAPTURE = "vllm-completions-sample.txt"
CODEC = {"prompt": "Hi", "max_tokens": 8, "stream_format": "msgpack"}
CODEC_CLIENT = {"Codec-Client-Version": "0.4"}


@dataclass
class ModelBackend(FakeUpstream):
    """A fake backend that also answers the drift check's `/tokenize` (llama.cpp's shape) with
    `tokenizer`'s IDs, shifted by one when `wrong` (a backend that drifted). Those probes are
    kept in `tokenized`, apart from the traffic the proxy relays."""

    tokenizer: LoadedTokenizer | None = None
    wrong: bool = False
    tokenized: list[str] = field(default_factory=list)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/tokenize" or self.tokenizer is None:
            return await super()._handle(request)
        text = (await request.json())["content"]
        self.tokenized.append(text)
        ids = self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
        return web.json_response({"tokens": [i + 1 for i in ids] if self.wrong else ids})


@dataclass
class Deployment:
    proxy: ProxyClient
    backends: dict[str, ModelBackend]

    @property
    def app(self) -> web.Application:
        return app_of(self.proxy)

    def model(self, name: str) -> ServedModel:
        return self.app[SERVED_MODELS].models[name]

    def traffic(self) -> dict[str, list[str]]:
        """`METHOD path` of every request that reached each backend (health checks apart)."""
        return {
            name: [f"{r.method} {r.path_qs}" for r in backend.requests]
            for name, backend in self.backends.items()
        }

    def bodies(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(r.body) for r in self.backends[name].requests if r.body]


Deploy = Callable[..., Awaitable[Deployment]]


@pytest.fixture
def deploy(aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient) -> Deploy:
    """Start one backend per model, then the proxy in front of them."""

    async def make(
        models: Sequence[tuple[ModelSettings, Vocabulary, ModelBackend | None]],
        **changes: Any,
    ) -> Deployment:
        backends: dict[str, ModelBackend] = {}
        entries = []
        for entry, _, backend in models:
            if backend is None:  # nothing listens there: a backend that is down
                url = f"http://127.0.0.1:{free_port()}"
            else:
                server = await aiohttp_server(backend.app())
                url = str(server.make_url("")).rstrip("/")
                backends[entry.name] = backend
            entries.append(ModelSettings(**{**entry.__dict__, "upstreams": (url,)}))
        settings = pinned_draws.settings(models=tuple(entries), **{"drift_check": False, **changes})
        vocabularies = {entry.name: vocabulary for entry, vocabulary, _ in models}
        app = create_app(settings, vocabularies)
        return Deployment(await aiohttp_client(app), backends)

    return make


PLACEHOLDER = ("http://placeholder",)  # replaced by each backend's URL


def replaying(capture: str, name: str) -> ModelBackend:
    return ModelBackend(script=Script(load_capture(capture)), models=[name])


@pytest.fixture
def twins(deploy: Deploy, smollm2_gguf: Path, smollm2_vocabulary: Vocabulary) -> Deploy:
    """Two SmolLM2 models with their own backends: `smol` (the default, alias `org/smol`)
    and `twin` (alias `t`); `twin={...}` changes twin's entry."""

    async def make(twin: dict[str, Any] | None = None, **changes: Any) -> Deployment:
        smol_entry = ModelSettings("smol", PLACEHOLDER, smollm2_gguf, aliases=("org/smol",))
        twin_entry = ModelSettings(
            "twin", PLACEHOLDER, smollm2_gguf, aliases=("t",), **(twin or {})
        )
        return await deploy(
            [
                (smol_entry, smollm2_vocabulary, replaying(SMOL_CAPTURE, "smol")),
                (twin_entry, smollm2_vocabulary, replaying(QWEN_CAPTURE, "twin")),
            ],
            **changes,
        )

    return make


def qwen3_path() -> Path:
    return assets.QWEN3_TOKENIZER.ensure()


@pytest.fixture
def pair(
    deploy: Deploy,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    qwen3_vocabulary: Vocabulary,
) -> Deploy:
    """`smol` (SmolLM2, the default) and `qwen` (Qwen3, alias `q3`)."""

    async def make(qwen: dict[str, Any] | None = None, **changes: Any) -> Deployment:
        smol_entry = ModelSettings("smol", PLACEHOLDER, smollm2_gguf)
        qwen_entry = ModelSettings(
            "qwen", PLACEHOLDER, qwen3_path(), aliases=("q3",), **(qwen or {})
        )
        return await deploy(
            [
                (smol_entry, smollm2_vocabulary, replaying(SMOL_CAPTURE, "smol")),
                (qwen_entry, qwen3_vocabulary, replaying(QWEN_CAPTURE, "qwen")),
            ],
            **changes,
        )

    return make


async def post(
    proxy: ProxyClient, path: str, **kwargs: Any
) -> tuple[int, Mapping[str, str], bytes]:
    async with proxy.post(path, **kwargs) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


def codec_stream(status: int, headers: Mapping[str, str], raw: bytes) -> None:
    """A whole msgpack Codec stream, with its map header: a JSON 200 is not one."""
    assert status == 200, raw
    assert "Codec-Tokenizer-Map" in headers
    assert frames_of(raw, "msgpack")[-1].done


def relayed(status: int, headers: Mapping[str, str], raw: bytes, capture: str) -> None:
    """The backend's answer, `capture`, relayed as it came: JSON, not Codec."""
    assert status == 200, raw
    assert "Codec-Tokenizer-Map" not in headers
    assert raw == load_capture(capture).body


def assert_model_not_found(status: int, raw: bytes, name: str) -> None:
    assert status == 404, raw
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    assert repr(name) in error["message"]


# --- routing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "backend"), [("smol", "smol"), ("org/smol", "smol"), ("twin", "twin"), ("t", "twin")]
)
async def test_json_goes_to_the_named_models_backend_unchanged(
    twins: Deploy, name: str, backend: str
) -> None:
    deployment = await twins()
    raw = json.dumps({"model": name, "prompt": "Hi", "stream": True}).encode()
    status, _, body = await post(deployment.proxy, "/v1/completions", data=raw)
    assert status == 200
    other = "twin" if backend == "smol" else "smol"
    assert deployment.traffic()[other] == []
    (sent,) = deployment.backends[backend].requests
    assert sent.path_qs == "/v1/completions"
    assert sent.body == raw  # byte for byte: no `upstream_model`, nothing renamed
    assert body == deployment.backends[backend].script.capture.body


@pytest.mark.parametrize("name", ["twin", "t"])
async def test_chat_json_and_codec_are_routed_alike(twins: Deploy, name: str) -> None:
    deployment = await twins()
    chat = Script(load_capture("llamacpp-chat-sample.txt"))
    for backend in deployment.backends.values():
        backend.script = chat
    messages = [{"role": "user", "content": "Hi"}]
    for extra in ({"stream": True}, {"stream_format": "protobuf"}):
        status, _, _ = await post(
            deployment.proxy,
            "/v1/chat/completions",
            json={"model": name, "messages": messages, **extra},
        )
        assert status == 200
    assert deployment.traffic() == {
        "smol": [],
        "twin": ["POST /v1/chat/completions"] * 2,
    }
    # A Codec request goes up as the client named it (no `upstream_model` set).
    assert [b["model"] for b in deployment.bodies("twin")] == [name, name]


async def test_no_model_goes_to_the_default(twins: Deploy) -> None:
    deployment = await twins(default_model="t")  # by an alias, too
    raw = b'{"prompt": "Hi", "stream": true}'
    assert (await post(deployment.proxy, "/v1/completions", data=raw))[0] == 200
    assert (await post(deployment.proxy, "/v1/completions", json=CODEC))[0] == 200
    assert deployment.traffic()["smol"] == []
    json_request, codec_request = deployment.backends["twin"].requests
    assert json_request.body == raw  # JSON: as sent, no model added
    # Codec: the model's own name, so a backend serving several knows which.
    assert json.loads(codec_request.body)["model"] == "twin"


async def test_path_b_is_routed_by_the_codec_model_header(twins: Deploy) -> None:
    deployment = await twins()
    body = msgpack.packb({"prompt_ids": [504, 3575, 282], "max_tokens": 4})
    for header in ({"Codec-Model": "t"}, {}):
        status, _, _ = await post(
            deployment.proxy,
            "/v1/completions/codec",
            data=body,
            headers={"Content-Type": "application/x-msgpack", **header},
        )
        assert status == 200
    assert deployment.traffic() == {
        "smol": ["POST /v1/completions"],
        "twin": ["POST /v1/completions"],
    }
    # Path B bodies name no model: the routed model's name goes up, never a listing lookup.
    assert [b["model"] for b in deployment.bodies("twin")] == ["twin"]
    assert [b["model"] for b in deployment.bodies("smol")] == ["smol"]


UNKNOWN_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"json": {"model": "nope", "prompt": "Hi", "stream": True}}),
    ("/v1/completions", {"json": {"model": "nope", **CODEC}}),
    ("/v1/completions", {"json": {"model": "nope", **CODEC, "stream_format": "protobuf"}}),
    (
        "/v1/chat/completions",
        {"json": {"model": "nope", "messages": [{"role": "user", "content": "Hi"}]}},
    ),
    (
        "/v1/chat/completions",
        {
            "json": {
                "model": "nope",
                "messages": [{"role": "user", "content": "Hi"}],
                "stream_format": "msgpack",
            }
        },
    ),
    (
        "/v1/completions/codec",
        {
            "data": msgpack.packb({"prompt_ids": [1, 2, 3]}),
            "headers": {"Content-Type": "application/x-msgpack", "Codec-Model": "nope"},
        },
    ),
    ("/v1/embeddings", {"json": {"model": "nope", "input": "Hi"}}),
    # A body large enough to be parsed in a worker thread (generation.py `off_loop`).
    ("/v1/completions", {"json": {"model": "nope", **CODEC, "prompt": list(range(20000))}}),
    # A name is a name: no case folding, no prefix matching.
    ("/v1/completions", {"json": {"model": "SMOL", "prompt": "Hi"}}),
    ("/v1/completions", {"json": {"model": "smol ", **CODEC}}),
]


@pytest.mark.parametrize(("path", "kwargs"), UNKNOWN_REQUESTS)
async def test_an_unknown_model_is_404_before_any_upstream(
    twins: Deploy, path: str, kwargs: dict[str, Any]
) -> None:
    deployment = await twins()
    status, headers, raw = await post(deployment.proxy, path, **kwargs)
    name = kwargs.get("json", {}).get("model") or kwargs["headers"]["Codec-Model"]
    assert_model_not_found(status, raw, name)
    assert headers["Content-Type"].startswith("application/json")
    assert deployment.traffic() == {"smol": [], "twin": []}


async def test_a_model_that_is_not_a_string_is_400(twins: Deploy) -> None:
    deployment = await twins()
    for model in (5, ["smol"], {"name": "smol"}):
        status, _, raw = await post(
            deployment.proxy, "/v1/completions", json={"model": model, **CODEC}
        )
        assert status == 400, raw
        assert json.loads(raw)["error"]["param"] == "model"
    assert deployment.traffic() == {"smol": [], "twin": []}


async def test_v1_models_lists_every_configured_name(twins: Deploy) -> None:
    deployment = await twins(default_model="twin")
    async with deployment.proxy.get("/v1/models") as resp:
        assert resp.status == 200
        listing = await resp.json()
    assert listing["object"] == "list"
    # The default first, each model's own name before its aliases.
    assert [entry["id"] for entry in listing["data"]] == ["twin", "t", "smol", "org/smol"]
    for entry in listing["data"]:
        assert entry["object"] == "model"
        assert entry["owned_by"] == "codec-proxy"
        assert isinstance(entry["created"], int)
    for name in ("org/smol", "t"):  # a name with a slash is a path of two segments
        async with deployment.proxy.get(f"/v1/models/{name}") as resp:
            assert resp.status == 200
            assert (await resp.json())["id"] == name
    async with deployment.proxy.get("/v1/models/nope") as resp:
        assert_model_not_found(resp.status, await resp.read(), "nope")
    assert deployment.traffic() == {"smol": [], "twin": []}


async def test_models_sharing_a_tokenizer_share_one_map(twins: Deploy) -> None:
    deployment = await twins()
    smol, twin = deployment.model("smol"), deployment.model("twin")
    assert smol.published.digest == twin.published.digest
    async with deployment.proxy.get("/.well-known/codec/index.json") as resp:
        (entry,) = (await resp.json())["maps"]
    assert entry["models"] == ["smol", "org/smol", "twin", "t"]
    for name in ("smol", "t"):
        _, headers, _ = await post(
            deployment.proxy, "/v1/completions", json={**CODEC, "model": name}
        )
        assert headers["Codec-Tokenizer-Map"] == smol.published.header_value


async def test_codec_can_be_turned_off_for_one_model(twins: Deploy) -> None:
    deployment = await twins(twin={"codec_enabled": False})
    proxy = deployment.proxy
    status, _, raw = await post(proxy, "/v1/completions", json={**CODEC, "model": "t"})
    assert status == 403
    assert json.loads(raw)["error"]["code"] == "codec_not_enabled"
    assert deployment.traffic()["twin"] == []  # refused before the backend is asked
    # JSON is never refused, and the other model's Codec is untouched.
    json_answer = await post(proxy, "/v1/completions", json={"model": "t", "prompt": "Hi"})
    relayed(*json_answer, QWEN_CAPTURE)
    codec_stream(*await post(proxy, "/v1/completions", json={**CODEC, "model": "smol"}))
    assert (await readyz(proxy))[0] == 200


async def test_prompt_limits_and_token_ids_are_each_models_own(twins: Deploy) -> None:
    deployment = await twins(twin={"max_prompt_ids": 4, "token_ids": "retokenize"})
    proxy = deployment.proxy
    prompt = [504, 3575, 282, 4649, 314]
    status, _, raw = await post(
        proxy, "/v1/completions", json={**CODEC, "model": "t", "prompt": prompt}
    )
    assert status == 413, raw
    path_b = {"Content-Type": "application/x-msgpack", "Codec-Model": "twin"}
    body = msgpack.packb({"prompt_ids": prompt})
    assert (await post(proxy, "/v1/completions/codec", data=body, headers=path_b))[0] == 413
    assert deployment.traffic()["twin"] == []
    status, headers, _ = await post(
        proxy, "/v1/completions", json={**CODEC, "model": "t", "prompt": prompt[:4]}
    )
    assert (status, headers["Codec-Token-Source"]) == (200, "retokenized")
    status, _, _ = await post(
        proxy, "/v1/completions", json={**CODEC, "model": "smol", "prompt": prompt}
    )
    assert status == 200
    (twin_body,) = deployment.bodies("twin")
    (smol_body,) = deployment.bodies("smol")
    # Only the model left at `auto` asks its backend for the sampled IDs.
    assert "return_token_ids" not in twin_body
    assert "n_probs" not in twin_body
    assert "return_token_ids" in smol_body or "n_probs" in smol_body


async def test_upstream_model_renames_json_and_codec(twins: Deploy) -> None:
    # The backend knows twin by another name than its clients do (vLLM's --served-model-name).
    deployment = await twins(twin={"upstream_model": "served-twin"})
    proxy = deployment.proxy
    raw = json.dumps({"model": "t", "prompt": "Hi", "stream": True, "seed": 7}).encode()
    assert (await post(proxy, "/v1/completions", data=raw))[0] == 200
    coded = gzip.compress(raw)
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    assert (await post(proxy, "/v1/completions", data=coded, headers=headers))[0] == 200
    assert (await post(proxy, "/v1/completions", json={"model": "twin", **CODEC}))[0] == 200
    body = msgpack.packb({"prompt_ids": [504, 3575], "max_tokens": 4})
    path_b = {"Content-Type": "application/x-msgpack", "Codec-Model": "twin"}
    assert (await post(proxy, "/v1/completions/codec", data=body, headers=path_b))[0] == 200
    requests = deployment.backends["twin"].requests
    assert [json.loads(r.body)["model"] for r in requests] == ["served-twin"] * 4
    # The rest of a renamed JSON body is the client's.
    assert json.loads(requests[0].body) == {**json.loads(raw), "model": "served-twin"}
    # A renamed body is the decoded one: its coding no longer applies.
    assert "Content-Encoding" not in requests[1].headers
    assert deployment.traffic()["smol"] == []


async def test_other_routes_go_to_the_model_the_body_names_else_the_default(
    twins: Deploy,
) -> None:
    deployment = await twins()
    proxy = deployment.proxy
    await post(proxy, "/v1/embeddings", json={"model": "t", "input": "Hi"})
    await post(proxy, "/tokenize", json={"content": "Hi"})
    await post(proxy, "/tokenize", json={"content": "Hi", "model": "twin"})
    async with proxy.get("/props") as resp:
        await resp.read()
    # A request whose body names no model goes where Codec-Model says, as Path B's does.
    await post(proxy, "/tokenize", json={"content": "Hi"}, headers={"Codec-Model": "t"})
    async with proxy.get("/props", headers={"Codec-Model": "twin"}) as resp:
        await resp.read()
    # The body's own model comes first.
    await post(proxy, "/tokenize", json={"model": "smol"}, headers={"Codec-Model": "t"})
    # A compressed body names its model all the same, and goes up as it was sent.
    coded = gzip.compress(b'{"model": "t", "input": "Hi"}')
    await post(proxy, "/v1/embeddings", data=coded, headers={"Content-Encoding": "gzip"})
    assert deployment.traffic() == {
        "smol": ["POST /tokenize", "GET /props", "POST /tokenize"],
        "twin": [
            "POST /v1/embeddings",
            "POST /tokenize",
            "POST /tokenize",
            "GET /props",
            "POST /v1/embeddings",
        ],
    }
    relayed = deployment.backends["twin"].requests[-1]
    assert (relayed.body, relayed.headers["Content-Encoding"]) == (coded, "gzip")


UNREADABLE_BODIES = [
    pytest.param(b"model=twin", {"Content-Type": "text/plain"}, id="not-json"),
    pytest.param(b'["t"]', {"Content-Type": "application/json"}, id="not-an-object"),
    pytest.param(b"\x1f\x8b not gzip", {"Content-Encoding": "gzip"}, id="corrupt-coding"),
    pytest.param(b'{"model": "t"}', {"Content-Encoding": "compress"}, id="unknown-coding"),
]


@pytest.mark.parametrize(("data", "headers"), UNREADABLE_BODIES)
async def test_a_body_not_read_for_its_model_needs_codec_model_when_several_are_served(
    twins: Deploy,
    deploy: Deploy,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    data: bytes,
    headers: dict[str, str],
) -> None:
    # It may well name a model (a form field, a coding we cannot undo): the default would be
    # a guess that sends it to another model's backend.
    deployment = await twins()
    proxy = deployment.proxy
    status, _, raw = await post(proxy, "/v1/embeddings", data=data, headers=headers)
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert (error["code"], error["param"]) == ("model_required", "model")
    assert "Codec-Model" in error["message"]
    assert deployment.traffic() == {"smol": [], "twin": []}
    status, _, _ = await post(
        proxy, "/v1/embeddings", data=data, headers={**headers, "Codec-Model": "t"}
    )
    assert status == 200
    (relayed,) = deployment.backends["twin"].requests
    assert relayed.body == data  # as it was sent: not read, not renamed
    assert {k: relayed.headers[k] for k in headers} == headers
    # With one model there is nothing to guess: it goes there, as it always did.
    smol = ModelSettings("smol", PLACEHOLDER, smollm2_gguf)
    single = await deploy([(smol, smollm2_vocabulary, replaying(SMOL_CAPTURE, "smol"))])
    assert (await post(single.proxy, "/v1/embeddings", data=data, headers=headers))[0] == 200
    assert single.traffic() == {"smol": ["POST /v1/embeddings"]}


async def test_relayed_bodies_are_renamed_as_generation_bodies_are(twins: Deploy) -> None:
    deployment = await twins(twin={"upstream_model": "served-twin"})
    proxy = deployment.proxy
    raw = json.dumps({"model": "t", "input": ["Hi", "there"], "dimensions": 8}).encode()
    for path in ("/v1/completions", "/v1/embeddings"):
        assert (await post(proxy, path, data=raw))[0] == 200
    generation, relayed = deployment.backends["twin"].requests
    # The one change a JSON body gets, the same bytes on either kind of route.
    assert relayed.body == generation.body
    assert json.loads(relayed.body) == {**json.loads(raw), "model": "served-twin"}
    coded = gzip.compress(b'{"model": "twin", "tokens": [504, 3575]}')
    await post(proxy, "/detokenize", data=coded, headers={"Content-Encoding": "gzip"})
    # Named by Codec-Model only: the body gets the upstream's name, as a generation body that
    # names no model does.
    await post(proxy, "/tokenize", json={"prompt": "Hi"}, headers={"Codec-Model": "t"})
    async with proxy.get("/props", headers={"Codec-Model": "t"}) as resp:
        await resp.read()
    detokenize, tokenize, props = deployment.backends["twin"].requests[2:]
    assert json.loads(detokenize.body) == {"model": "served-twin", "tokens": [504, 3575]}
    assert "Content-Encoding" not in detokenize.headers  # the decoded body went up
    assert json.loads(tokenize.body) == {"prompt": "Hi", "model": "served-twin"}
    assert props.body == b""  # no body, nothing to rename
    assert deployment.traffic()["smol"] == []


# --- each model's map and dictionaries -------------------------------------------------------


async def fetch_map(proxy: ProxyClient, map_id: str) -> codecai.TokenizerMap:
    async with proxy.get(f"/.well-known/codec/maps/inline/{map_id}.json") as resp:
        assert resp.status == 200
        return codecai.TokenizerMap.from_json(await resp.read())


def text_of(tokenizer_map: codecai.TokenizerMap, frames: list[codecai.CodecFrame]) -> str:
    detokenizer = codecai.Detokenizer(tokenizer_map)
    return "".join(detokenizer.render(f.ids, partial=not f.done) for f in frames)


async def test_each_codec_response_names_and_follows_its_own_models_map(pair: Deploy) -> None:
    deployment = await pair()
    proxy = deployment.proxy
    rendered: dict[str, tuple[codecai.TokenizerMap, list[codecai.CodecFrame]]] = {}
    for name, fmt in (("smol", "msgpack"), ("q3", "protobuf"), ("qwen", "msgpack")):
        payload = {**CODEC, "model": name, "stream_format": fmt}
        status, headers, raw = await post(proxy, "/v1/completions", json=payload)
        assert status == 200
        model = deployment.model("smol" if name == "smol" else "qwen")
        assert headers["Codec-Tokenizer-Map"] == model.published.header_value
        map_id = headers["Codec-Tokenizer-Map"].partition(" ")[0]
        tokenizer_map = await fetch_map(proxy, map_id)
        assert tokenizer_map.vocab_size == model.vocabulary.loaded.vocab_size
        frames = await codecai_frames(raw, fmt)
        capture = deployment.backends[model.name].script.capture
        assert text_of(tokenizer_map, frames) == capture.stream_text()
        rendered[name] = (tokenizer_map, frames)
    smol_map, _ = rendered["smol"]
    qwen_map, qwen_frames = rendered["qwen"]
    assert smol_map.id != qwen_map.id
    # The map matters: Qwen3's IDs read with SmolLM2's map are not the text.
    qwen_text = deployment.backends["qwen"].script.capture.stream_text()
    assert max(i for f in qwen_frames for i in f.ids) >= smol_map.vocab_size or (
        text_of(smol_map, qwen_frames) != qwen_text
    )


async def test_prompt_ids_are_checked_against_the_routed_models_vocabulary(pair: Deploy) -> None:
    deployment = await pair()
    qwen_only = [151000, 100000]  # inside Qwen3's vocabulary, beyond SmolLM2's 49152
    payload = {**CODEC, "prompt": qwen_only}
    status, _, _ = await post(deployment.proxy, "/v1/completions", json={**payload, "model": "q3"})
    assert status == 200
    status, _, raw = await post(
        deployment.proxy, "/v1/completions", json={**payload, "model": "smol"}
    )
    assert status == 400
    assert "outside the vocabulary [0, 49152)" in json.loads(raw)["error"]["message"]
    assert deployment.traffic() == {"smol": [], "qwen": ["POST /v1/completions"]}


async def test_index_lists_every_models_map_with_its_names_and_dictionaries(pair: Deploy) -> None:
    deployment = await pair()
    async with deployment.proxy.get("/.well-known/codec/index.json") as resp:
        assert resp.status == 200
        index = await resp.json()
    smol, qwen = deployment.model("smol"), deployment.model("qwen")
    by_id = {entry["id"]: entry for entry in index["maps"]}
    assert set(by_id) == {smol.published.id, qwen.published.id}
    assert by_id[smol.published.id]["models"] == ["smol"]
    assert by_id[qwen.published.id]["models"] == ["qwen", "q3"]
    assert by_id[smol.published.id]["hash"] == smol.published.hash
    assert by_id[qwen.published.id]["hash"] == qwen.published.hash
    # The shipped dictionaries are SmolLM2's; Qwen3 gets none of them.
    hashes = {d["hash"] for d in by_id[smol.published.id]["zstd_dictionaries"]}
    assert hashes == {r.hash for r in smol.dictionaries.records}
    assert len(hashes) == 2
    assert "zstd_dictionaries" not in by_id[qwen.published.id]
    assert qwen.dictionaries.records == ()
    # Large maps: `maps/<id>.json` is a pointer to the content-addressed copy, whose bytes
    # hash to what the index says.
    for entry in index["maps"]:
        async with deployment.proxy.get(f"/.well-known/codec/maps/{entry['id']}.json") as resp:
            pointer = await resp.json()
        assert pointer == {"id": entry["id"], "url": entry["url"], "hash": entry["hash"]}
        async with deployment.proxy.get(URL(entry["url"]).path) as resp:
            assert resp.status == 200
            body = await resp.read()
        assert f"sha256:{hashlib.sha256(body).hexdigest()}" == entry["hash"]


async def post_zstd(
    proxy: ProxyClient, model: str, accept: str
) -> tuple[int, Mapping[str, str], bytes]:
    async with proxy.post(
        "/v1/completions",
        json={**CODEC, "model": model},
        headers={**CODEC_CLIENT, "Accept-Encoding": accept},
        auto_decompress=False,
    ) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


async def dictionary_of(proxy: ProxyClient, header: str) -> bytes:
    async with proxy.get(f"/.well-known/codec/dicts/{header.removeprefix('sha256:')}.zstd") as resp:
        assert resp.status == 200
        return await resp.read()


async def test_zstd_uses_each_models_own_dictionary_and_none_without_one(
    pair: Deploy, tmp_path: Path
) -> None:
    deployment = await pair()
    proxy = deployment.proxy
    smol = deployment.model("smol")
    status, headers, raw = await post_zstd(proxy, "smol", "zstd, identity;q=0")
    assert status == 200
    assert headers["Content-Encoding"] == "zstd"
    expected = smol.dictionaries.for_format("msgpack")
    assert expected is not None
    assert headers["Codec-Zstd-Dict"] == expected.record.hash
    dictionary = await dictionary_of(proxy, headers["Codec-Zstd-Dict"])
    loaded = {codecai.hash_zstd_dict(dictionary): dictionary}
    assert codecai.select_zstd_dict_for_response(headers, loaded_dicts=loaded) == dictionary
    frames = await codecai_frames(decompress_whole("zstd", raw, dictionary), "msgpack")
    smol_map = await fetch_map(proxy, smol.published.id)
    assert text_of(smol_map, frames) == load_capture(SMOL_CAPTURE).stream_text()
    # Qwen3 has no dictionary: never zstd, and no Codec-Zstd-Dict on what it gets instead.
    status, headers, _ = await post_zstd(proxy, "qwen", "zstd, br")
    assert (status, headers.get("Content-Encoding")) == (200, "br")
    assert "Codec-Zstd-Dict" not in headers
    status, _, raw = await post_zstd(proxy, "qwen", "zstd, identity;q=0")
    assert status == 406, raw
    assert deployment.traffic()["qwen"] == ["POST /v1/completions"]  # the 406 reached no one


async def test_a_dictionary_of_its_own_for_the_second_model(
    pair: Deploy, tmp_path: Path, qwen3_vocabulary: Vocabulary
) -> None:
    # A raw-content dictionary (no training needed): frames of Qwen3 IDs.
    ids = qwen3_vocabulary.loaded.tokenizer.encode("The capital of France is Paris.").ids
    frames = b"".join(msgpack.packb({"ids": [i], "done": False}) for i in ids)
    path = tmp_path / "qwen3-msgpack.zstd"
    path.write_bytes(frames * 64)
    deployment = await pair(qwen={"zstd_dicts": (f"msgpack={path}",)})
    proxy = deployment.proxy
    smol, qwen = deployment.model("smol"), deployment.model("qwen")
    qwen_dict = qwen.dictionaries.for_format("msgpack")
    smol_dict = smol.dictionaries.for_format("msgpack")
    assert qwen_dict is not None
    assert smol_dict is not None
    for name, expected, capture in (
        ("qwen", qwen_dict, QWEN_CAPTURE),
        ("smol", smol_dict, SMOL_CAPTURE),
    ):
        status, headers, raw = await post_zstd(proxy, name, "zstd, identity;q=0")
        assert status == 200
        assert headers["Codec-Zstd-Dict"] == expected.record.hash
        dictionary = await dictionary_of(proxy, headers["Codec-Zstd-Dict"])
        decoded = await codecai_frames(decompress_whole("zstd", raw, dictionary), "msgpack")
        model = deployment.model(name)
        tokenizer_map = await fetch_map(proxy, model.published.id)
        assert text_of(tokenizer_map, decoded) == load_capture(capture).stream_text()
    async with proxy.get("/.well-known/codec/index.json") as resp:
        index = await resp.json()
    entries = {e["id"]: e for e in index["maps"]}
    assert [d["hash"] for d in entries[qwen.published.id]["zstd_dictionaries"]] == [
        qwen_dict.record.hash
    ]


# --- per-model health, drift and readiness ---------------------------------------------------


async def readyz(proxy: ProxyClient) -> tuple[int, dict[str, Any]]:
    async with proxy.get("/readyz") as resp:
        return resp.status, await resp.json()


async def test_a_down_backend_takes_out_its_model_only(
    deploy: Deploy, smollm2_gguf: Path, smollm2_vocabulary: Vocabulary
) -> None:
    up = ModelSettings("up", PLACEHOLDER, smollm2_gguf)
    down = ModelSettings("down", PLACEHOLDER, smollm2_gguf)
    deployment = await deploy(
        [(up, smollm2_vocabulary, replaying(SMOL_CAPTURE, "up")), (down, smollm2_vocabulary, None)]
    )
    proxy = deployment.proxy
    # Its health check failed at start: nothing to send to, Codec or JSON alike.
    for payload in ({**CODEC, "model": "down"}, {"model": "down", "prompt": "x"}):
        status, _, raw = await post(proxy, "/v1/completions", json=payload)
        assert status == 503, raw
        assert json.loads(raw)["error"]["code"] == "no_upstream"
    codec_stream(*await post(proxy, "/v1/completions", json={**CODEC, "model": "up"}))
    # Only the default is required: the process is ready, and says which model is not.
    status, report = await readyz(proxy)
    assert status == 200
    assert report["status"] == "ready"
    up_checks = {
        "upstreams": {"ready": True, "reason": "ok"},
        "tokenizer": {"ready": True, "reason": "drift_check_disabled"},
    }
    assert report["models"]["up"] == {
        "ready": True,
        "required": True,
        "codec": True,
        "checks": up_checks,
    }
    assert report["models"]["down"] == {
        "ready": False,
        "required": False,
        "codec": True,
        "checks": {**up_checks, "upstreams": {"ready": False, "reason": "no_upstream"}},
    }
    # `checks` stays what a single-model proxy reported: the process's and the default's.
    assert report["checks"] == up_checks
    samples = metric_samples(await metrics_text(proxy))
    assert samples[("codec_proxy_model_ready", (("model", "down"),))] == 0
    assert samples[("codec_proxy_model_ready", (("model", "up"),))] == 1


@pytest.mark.parametrize(
    ("required", "default_model"),
    [(True, None), (None, "down")],
    ids=["required-by-its-entry", "required-as-the-default"],
)
async def test_readiness_follows_the_required_models(
    deploy: Deploy,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    required: bool | None,
    default_model: str | None,
) -> None:
    up = ModelSettings("up", PLACEHOLDER, smollm2_gguf)
    down = ModelSettings("down", PLACEHOLDER, smollm2_gguf, required=required)
    deployment = await deploy(
        [(up, smollm2_vocabulary, replaying(SMOL_CAPTURE, "up")), (down, smollm2_vocabulary, None)],
        default_model=default_model,
    )
    status, report = await readyz(deployment.proxy)
    assert status == 503
    assert report["status"] == "not_ready"
    assert {"model": "down", "check": "upstreams", "reason": "no_upstream"}.items() <= (
        report["reasons"][0].items()
    )
    assert all(reason.get("model") == "down" for reason in report["reasons"])
    assert report["models"]["down"]["required"] is True
    assert report["models"]["up"]["ready"] is True
    # The model that is up still serves.
    status, _, _ = await post(deployment.proxy, "/v1/completions", json={**CODEC, "model": "up"})
    assert status == 200


async def test_drift_on_one_model_refuses_codec_for_it_only(
    deploy: Deploy,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    qwen3_vocabulary: Vocabulary,
) -> None:
    smol = ModelSettings("smol", PLACEHOLDER, smollm2_gguf)
    qwen = ModelSettings("qwen", PLACEHOLDER, qwen3_path())
    drifted = ModelSettings("drifted", PLACEHOLDER, smollm2_gguf, map_id="smol-drifted")
    backends = {
        "smol": replaying(SMOL_CAPTURE, "smol"),
        "qwen": replaying(QWEN_CAPTURE, "qwen"),
        "drifted": replaying(SMOL_CAPTURE, "drifted"),
    }
    backends["smol"].tokenizer = smollm2_vocabulary.loaded
    backends["qwen"].tokenizer = qwen3_vocabulary.loaded
    backends["drifted"].tokenizer = smollm2_vocabulary.loaded
    backends["drifted"].wrong = True
    deployment = await deploy(
        [
            (smol, smollm2_vocabulary, backends["smol"]),
            (qwen, qwen3_vocabulary, backends["qwen"]),
            (drifted, smollm2_vocabulary, backends["drifted"]),
        ],
        drift_check=True,
    )
    proxy = deployment.proxy
    # Each model's probes went to its own backend, in its own tokenizer's terms.
    assert all(backend.tokenized for backend in backends.values())
    status, headers, raw = await post(proxy, "/v1/completions", json={**CODEC, "model": "drifted"})
    assert status == 503
    assert json.loads(raw)["error"]["code"] == "tokenizer_mismatch"
    # Ask again after the next drift check (drift_check_interval, 300 s), which may lift it.
    assert 1 <= int(headers["Retry-After"]) <= 300
    for name in ("smol", "qwen"):
        status, headers, _ = await post(proxy, "/v1/completions", json={**CODEC, "model": name})
        assert status == 200
        assert headers["Codec-Tokenizer-Map"] == deployment.model(name).published.header_value
    # JSON to the drifted model still passes.
    status, _, raw = await post(
        proxy, "/v1/completions", json={"model": "drifted", "prompt": "Hi", "stream": True}
    )
    assert (status, raw) == (200, load_capture(SMOL_CAPTURE).body)
    status, report = await readyz(proxy)
    assert status == 200  # `drifted` is not required
    models = report["models"]
    # Drift is the backend's, never a request's doing: the model is not ready as well.
    assert models["drifted"]["checks"]["tokenizer"] == {
        "ready": False,
        "reason": "tokenizer_mismatch",
        "refuses_codec": True,
    }
    assert (models["drifted"]["codec"], models["drifted"]["ready"]) == (False, False)
    for name in ("smol", "qwen"):
        assert models[name]["checks"]["tokenizer"]["reason"] == "tokenizer_matches_backend"
        assert (models[name]["codec"], models[name]["ready"]) == (True, True)
    samples = metric_samples(await metrics_text(proxy))
    assert samples[("codec_proxy_drift_detected", (("model", "drifted"),))] == 1
    assert samples[("codec_proxy_drift_detected", (("model", "qwen"),))] == 0
    assert samples[("codec_proxy_codec_available", (("model", "drifted"),))] == 0
    assert samples[("codec_proxy_codec_available", (("model", "smol"),))] == 1
    refused = samples[
        (
            "codec_proxy_codec_refused_total",
            (("model", "drifted"), ("reason", "tokenizer_mismatch")),
        )
    ]
    assert refused == 1


# --- logs and metrics ------------------------------------------------------------------------


async def metrics_text(proxy: ProxyClient) -> str:
    async with proxy.get("/metrics") as resp:
        return await resp.text()


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def request_counts(text: str) -> dict[str, float]:
    """`codec_proxy_requests_total` by model label, summed over the other labels."""
    counts: dict[str, float] = {}
    for (name, labels), value in metric_samples(text).items():
        if name == "codec_proxy_requests_total":
            model = dict(labels)["model"]
            counts[model] = counts.get(model, 0) + value
    return counts


async def test_metrics_and_access_log_carry_the_model(
    twins: Deploy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="codec_proxy.access")
    deployment = await twins()
    proxy = deployment.proxy
    await post(proxy, "/v1/completions", json={**CODEC, "model": "t"})
    await post(proxy, "/v1/completions", json={"prompt": "Hi"})  # the default
    await post(proxy, "/v1/completions", json={**CODEC, "model": "gpt-4o-secret-name"})
    async with proxy.get("/v1/models") as resp:
        await resp.read()
    async with proxy.get("/v1/models/another-secret-name") as resp:
        assert resp.status == 404
    text = await metrics_text(proxy)
    assert request_counts(text) == {"twin": 1, "smol": 1, "unknown": 2, "none": 1}
    assert "another-secret-name" not in text
    # Never the name a client sent: labels stay a bounded set.
    assert "gpt-4o-secret-name" not in text
    samples = metric_samples(text)
    codec = {
        labels: v
        for (name, labels), v in samples.items()
        if name == "codec_proxy_codec_requests_total"
    }
    assert [dict(labels)["model"] for labels in codec] == ["twin"]
    lines = [r.fields for r in caplog.records if hasattr(r, "fields")]
    by_route = [
        (line["route"], line["model"], line["status"])
        for line in lines
        if line["route"] != "/metrics"
    ]
    assert by_route == [
        ("/v1/completions", "twin", 200),
        ("/v1/completions", "smol", 200),
        ("/v1/completions", "unknown", 404),
        ("/v1/models", "none", 200),
        ("/v1/models/{name}", "unknown", 404),
    ]


# --- configuration checked at start ----------------------------------------------------------


def load_toml(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "codec-proxy.toml"
    path.write_text(text)
    return config.load(file=path, env={})


def one_line(exc: BaseException) -> str:
    message = getattr(exc, "message", str(exc))
    assert isinstance(message, str)
    assert "\n" not in message
    return message


TWO_MODELS = """
{top}

[[models]]
name = "{a}"
upstreams = ["http://a:8000"]
tokenizer = "/models/a.gguf"
{a_keys}

[[models]]
name = "{b}"
upstreams = ["http://b:8000"]
tokenizer = "/models/b.gguf"
{b_keys}
"""


def two_models(
    top: str = "", a: str = "a", b: str = "b", a_keys: str = "", b_keys: str = ""
) -> str:
    return TWO_MODELS.format(top=top, a=a, b=b, a_keys=a_keys, b_keys=b_keys)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (two_models(b="a"), "two models are named 'a'"),
        (two_models(a_keys='aliases = ["x", "x"]'), "model 'a': the name 'x' is listed twice"),
        (two_models(a_keys='aliases = ["a"]'), "model 'a': the name 'a' is listed twice"),
        (two_models(b_keys='aliases = ["a"]'), "model 'b': the name 'a' is also model 'a''s"),
        (
            two_models(a_keys='aliases = ["x"]', b_keys='aliases = ["x"]'),
            "model 'b': the name 'x' is also model 'a''s",
        ),
        (two_models('default_model = "c"'), "'default_model' 'c' is not a listed model"),
        (two_models('upstream = ["http://u:8000"]'), "'upstream' is per model"),
        (two_models('tokenizer = "/t.gguf"'), "'tokenizer' is per model"),
        (two_models('model = "m"'), "'model' is per model"),
        (two_models('map_id = "m"'), "'map_id' is per model"),
        (two_models(a_keys='colour = "red"'), "entry 0 ('a'): unknown key 'colour'"),
        (two_models(a_keys="flush_frames = -1"), "entry 0 ('a'): 'flush_frames' must be >= 0"),
        (
            two_models().replace("http://b:8000", "ftp://b"),
            "entry 1 ('b'): 'upstreams' must be an http:// or https:// URL",
        ),
        (
            'default_model = "a"\nupstream = ["http://u:1"]\ntokenizer = "/t"\n',
            "'default_model' needs a 'models' list",
        ),
    ],
)
def test_the_config_file_is_checked_with_one_line_naming_the_model(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_toml(tmp_path, text)
    assert expected in one_line(caught.value)


def test_an_entry_without_upstreams_names_the_entry(tmp_path: Path) -> None:
    text = '[[models]]\nname = "a"\ntokenizer = "/t.gguf"\n'
    with pytest.raises(ConfigError) as caught:
        load_toml(tmp_path, text)
    assert one_line(caught.value).endswith("entry 0 ('a'): 'upstreams' is required")


def test_a_valid_file_lists_every_model_default_first(tmp_path: Path) -> None:
    text = two_models('default_model = "y"', b_keys='aliases = ["y"]\nrequired = true')
    settings = load_toml(tmp_path, text)
    listed = settings.model_list()
    assert [(m.name, m.names, m.is_default, m.required) for m in listed] == [
        ("b", ("b", "y"), True, True),
        ("a", ("a",), False, False),
    ]


BROKEN_TOKENIZERS = {
    "missing.gguf": None,
    "broken.gguf": b"GGUF not really",
    "not-a-tokenizer.json": b'{"a": 1}',
    "truncated.json": b'{"model": ',
}


@pytest.mark.parametrize("file_name", BROKEN_TOKENIZERS)
def test_a_tokenizer_that_fails_to_load_names_its_model(
    tmp_path: Path, smollm2_gguf: Path, smollm2_vocabulary: Vocabulary, file_name: str
) -> None:
    broken = tmp_path / file_name
    content = BROKEN_TOKENIZERS[file_name]
    if content is not None:
        broken.write_bytes(content)
    models = (
        ModelSettings("good", ("http://a:1",), smollm2_gguf),
        ModelSettings("bad", ("http://b:1",), broken),
    )
    with pytest.raises(TokenizerLoadError) as caught:
        create_app(Settings(models=models), {"good": smollm2_vocabulary})
    message = one_line(caught.value)
    assert message.startswith(f"model 'bad': {broken}")


def test_serve_stops_with_that_one_line(tmp_path: Path, smollm2_gguf: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF not really")
    models = (
        ModelSettings("bad", ("http://b:1",), broken),  # the default: loaded first
        ModelSettings("good", ("http://a:1",), smollm2_gguf),
    )
    with pytest.raises(SystemExit) as caught:
        run_worker(Settings(models=models), 0)
    assert str(caught.value).startswith(f"codec-proxy: model 'bad': {broken}: ")
    assert "\n" not in str(caught.value)


def test_a_dictionary_trained_for_another_tokenizer_names_its_model(
    qwen3_vocabulary: Vocabulary, smollm2_gguf: Path, smollm2_vocabulary: Vocabulary
) -> None:
    smollm2_dict = DEFAULT_DICTIONARIES_MANIFEST.parent / "smollm2-msgpack-v1.zstd"
    models = (
        ModelSettings("smol", ("http://a:1",), smollm2_gguf),
        ModelSettings(
            "qwen", ("http://b:1",), qwen3_path(), zstd_dicts=(f"msgpack={smollm2_dict}",)
        ),
    )
    vocabularies = {"smol": smollm2_vocabulary, "qwen": qwen3_vocabulary}
    with pytest.raises(DictionaryError) as caught:
        create_app(Settings(models=models), vocabularies)
    message = one_line(caught.value)
    assert message.startswith("model 'qwen': ")
    assert "trained for another tokenizer" in message
    # The same file for the model it was trained for is fine.
    fine = (
        ModelSettings(
            "smol", ("http://a:1",), smollm2_gguf, zstd_dicts=(f"msgpack={smollm2_dict}",)
        ),
    )
    create_app(Settings(models=fine), {"smol": smollm2_vocabulary})


def test_two_tokenizers_under_one_map_id_are_refused(
    qwen3_vocabulary: Vocabulary, smollm2_gguf: Path, smollm2_vocabulary: Vocabulary
) -> None:
    models = (
        ModelSettings("smol", ("http://a:1",), smollm2_gguf, map_id="shared"),
        ModelSettings("qwen", ("http://b:1",), qwen3_path(), map_id="shared"),
    )
    with pytest.raises(ConfigError) as caught:
        create_app(Settings(models=models), {"smol": smollm2_vocabulary, "qwen": qwen3_vocabulary})
    message = one_line(caught.value)
    assert message.startswith("model 'qwen': map id 'shared'")


# --- one model, configured as before ---------------------------------------------------------


@pytest.mark.parametrize("model", [None, "smollm2-x"])
async def test_one_model_by_flags_serves_any_name_and_relays_the_listing(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    model: str | None,
) -> None:
    # As before there were several models: `model` only names what Codec requests that name
    # none are sent with; every name is served, and the listing is the backend's.
    backend = replaying(SMOL_CAPTURE, "backend-name")
    server = await aiohttp_server(backend.app())
    url = str(server.make_url("")).rstrip("/")
    settings = pinned_draws.settings(
        upstream=(url,), tokenizer=smollm2_gguf, model=model, drift_check=False
    )
    proxy = await aiohttp_client(create_app(settings, smollm2_vocabulary))
    for name in ("anything", "gpt-4o", None):
        payload = {**CODEC, **({} if name is None else {"model": name})}
        assert (await post(proxy, "/v1/completions", json=payload))[0] == 200
    raw = b'{"prompt": "Hi"}'
    assert (await post(proxy, "/v1/completions", data=raw))[0] == 200
    async with proxy.get("/v1/models") as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["backend-name"]
    async with proxy.get("/.well-known/codec/index.json") as resp:
        (entry,) = (await resp.json())["maps"]
    assert "models" not in entry  # a proxy serving any name has none to list
    sent = [json.loads(r.body).get("model") for r in backend.requests if r.body]
    assert sent == ["anything", "gpt-4o", model, None]  # JSON: as sent, nothing added
