"""What error bodies and log lines show of values the proxy did not choose.

A client's value (a model name, `stream_format`, a header, a path, a JSON key) is bounded
wherever it is echoed; URL credentials never reach a log line; a newline cannot forge a text
log line; and each request's log lines name the proxy's own id beside the client's.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgpack
import pytest
from multidict import CIMultiDict
from yarl import URL

from proxy import config, logs
from proxy.cli import announcement
from proxy.core.errors import ConfigError
from proxy.logs import UNPARSED_REQUESTS, JsonFormatter, TextFormatter
from proxy.server import create_app
from proxy.server.data.connections import Origin
from proxy.server.models.served_models import SERVED_MODELS
from proxy.settings import ModelSettings, Settings
from proxy.tokenizers.vocabulary import Vocabulary
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import MakeProxy, ProxyClient, default_model
from tests.server.policy_support import write_policy
from tests.server.raw_http import connections, request

HUGE = "m" * (4 << 20)  # 4 MiB: what a body may carry
LONG = "h" * 8000  # what a header or a request line may carry (aiohttp's limit is 8190)
# Whatever a value is, what is shown of it stays this small.
BODY_BOUND = 1024
LOG_BOUND = 4096
CHAT = [{"role": "user", "content": "Hi"}]
MSGPACK = {"Content-Type": "application/x-msgpack"}


def log_output(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every record captured, as each log format writes it; not aiohttp's own access log, which
    `logs.configure` turns off (the proxy's has its fields)."""
    return [
        formatter.format(r)
        for r in caplog.records
        if r.name != "aiohttp.access"
        for formatter in (TextFormatter(), JsonFormatter())
    ]


async def access_lines(caplog: pytest.LogCaptureFixture, count: int) -> list[dict[str, Any]]:
    """The access log's records, once there are `count`: a stream's is logged when its handler
    returns, which may be after its client has read it all."""
    lines: list[dict[str, Any]] = []
    for _ in range(150):
        lines = [r.fields for r in caplog.records if hasattr(r, "fields")]
        if len(lines) >= count:
            return lines
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(lines)} access-log lines, not {count}")


def sendable(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A large body goes as a stream (aiohttp warns about one given as bytes)."""
    kwargs = dict(kwargs)
    if "json" in kwargs:
        kwargs["data"] = json.dumps(kwargs.pop("json")).encode()
        kwargs["headers"] = {"Content-Type": "application/json", **kwargs.get("headers", {})}
    if "data" in kwargs:
        kwargs["data"] = io.BytesIO(kwargs["data"])
    return kwargs


@pytest.fixture
async def named(make_proxy: MakeProxy, upstream_url: str, smollm2_gguf: Path) -> ProxyClient:
    """A proxy serving one model by name: another name is a 404."""
    model = ModelSettings("smol", (upstream_url,), smollm2_gguf)
    return await make_proxy(upstream=(), tokenizer=None, models=(model,))


# (method, path, request keyword arguments, status): one value of the client's each.
HUGE_VALUES = {
    "model": ("POST", "/v1/completions", {"json": {"model": HUGE, "prompt": "Hi"}}, 404),
    "chat-model": (
        "POST",
        "/v1/chat/completions",
        {"json": {"model": HUGE, "messages": CHAT}},
        404,
    ),
    "relayed-model": ("POST", "/v1/embeddings", {"json": {"model": HUGE, "input": "Hi"}}, 404),
    "models-path": ("GET", "/v1/models/" + LONG, {}, 404),
    "codec-model-header": (
        "POST",
        "/v1/completions/codec",
        {
            "data": msgpack.packb({"prompt_ids": [1, 2]}),
            "headers": {**MSGPACK, "Codec-Model": LONG},
        },
        404,
    ),
    "stream-format": (
        "POST",
        "/v1/completions",
        {"json": {"prompt": "Hi", "stream_format": HUGE}},
        400,
    ),
    "chat-stream-format": (
        "POST",
        "/v1/chat/completions",
        {"json": {"messages": CHAT, "stream_format": HUGE}},
        400,
    ),
    "path-b-stream-format": (
        "POST",
        "/v1/completions/codec",
        {"data": msgpack.packb({"prompt_ids": [1, 2], "stream_format": HUGE}), "headers": MSGPACK},
        400,
    ),
    # The key of a long ID array is named when the array does not parse.
    "json-key": (
        "POST",
        "/v1/completions",
        {
            "data": b'{"prompt": "Hi", "' + HUGE.encode() + b'": [' + b"1," * 40000 + b",1]}",
            "headers": {"Content-Type": "application/json"},
        },
        400,
    ),
    "accept-encoding": (
        "POST",
        "/v1/completions",
        {
            "json": {"prompt": "Hi", "stream_format": "msgpack"},
            # Many lines of one field are one list (RFC 9110 §5.3): far more than a line.
            "headers": CIMultiDict([("Accept-Encoding", "identity;q=0, " + LONG)] * 64),
        },
        406,
    ),
    "content-encoding": (
        "POST",
        "/v1/completions",
        {"data": b"{}", "headers": {"Content-Encoding": LONG}},
        415,
    ),
    "content-type": (
        "POST",
        "/v1/completions/codec",
        {"data": b"\x80", "headers": {"Content-Type": LONG}},
        415,
    ),
    "expect": ("POST", "/v1/completions", {"json": {}, "headers": {"Expect": LONG}}, 417),
    "well-known-path": ("GET", "/.well-known/codec/maps/" + LONG, {}, 404),
    "client-version": ("GET", "/livez", {"headers": {"Codec-Client-Version": LONG}}, 200),
}


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"), HUGE_VALUES.values(), ids=list(HUGE_VALUES)
)
async def test_a_huge_client_value_gets_a_bounded_answer_and_bounded_logs(
    named: ProxyClient,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
) -> None:
    caplog.set_level(logging.INFO)
    async with named.request(method, path, **sendable(kwargs)) as resp:
        body = await resp.read()
        assert resp.status == status, body[:300]
    assert len(body) < BODY_BOUND
    lines = log_output(caplog)
    assert lines, "nothing was logged"
    assert sum(map(len, lines)) < LOG_BOUND
    assert upstream.requests == []


async def test_a_huge_path_to_a_route_the_policy_cannot_read(
    make_proxy: MakeProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Slashes the backend's router collapses: a path as long as a request line may be.
    caplog.set_level(logging.INFO)
    proxy = await make_proxy(safety_policy=write_policy(tmp_path))
    async with connections() as connect:
        connection = await connect(proxy)
        await connection.send(request("POST", "/" * 8000 + "completion", b"{}"))
        response = await connection.response()
    assert response.status == 403
    assert json.loads(response.body)["error"]["code"] == "route_not_policed"
    assert len(response.body) < BODY_BOUND
    assert sum(map(len, log_output(caplog))) < LOG_BOUND


@pytest.fixture
def parser_lines_bounded() -> Iterator[None]:
    """What `logs.configure` installs on aiohttp's logger (the tests keep pytest's handlers)."""
    server_log = logging.getLogger("aiohttp.server")
    server_log.addFilter(UNPARSED_REQUESTS)
    yield
    server_log.removeFilter(UNPARSED_REQUESTS)


async def test_a_malformed_header_gets_a_bounded_answer_and_bounded_logs(
    proxy: ProxyClient, caplog: pytest.LogCaptureFixture, parser_lines_bounded: None
) -> None:
    caplog.set_level(logging.INFO)
    async with connections() as connect:
        connection = await connect(proxy)
        await connection.send(request("GET", "/livez", headers={"X-A": LONG + "\x01"}))
        response = await connection.response()
    assert response.status == 400
    assert json.loads(response.body)["error"]["code"] == "malformed_request"
    assert len(response.body) < BODY_BOUND
    lines = log_output(caplog)
    assert any("Invalid header value char" in line for line in lines)
    assert sum(map(len, lines)) < LOG_BOUND


def test_configure_bounds_the_parser_lines() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        logs.configure("text", "INFO")
        assert UNPARSED_REQUESTS in logging.getLogger("aiohttp.server").filters
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("aiohttp.server").removeFilter(UNPARSED_REQUESTS)


# --- newlines in text logs -------------------------------------------------------------------

# A line of its own, as a terminal shows a carriage return, or as a viewer takes Unicode's line
# separator; a terminal escape that clears the screen.
FORGED = "\r2026-01-01 00:00:00,000 ERROR codec_proxy: forged\u2028\x1b[2J"


def no_control_characters(line: str) -> bool:
    return not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029" for c in line)


async def test_a_value_cannot_forge_a_text_log_line(
    named: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # In a path that reaches a log line (the model it names does not exist). A %0a there gets
    # no further than aiohttp's router, whose patterns do not match a newline.
    path = "/v1/embeddings" + quote(FORGED)
    async with named.post(URL(path, encoded=True), json={"model": "x"}) as resp:
        assert resp.status == 404
    # In an upstream's error text, logged when the stream ends with it.
    error = json.dumps({"error": {"message": f"boom\n{FORGED}"}}).encode()
    upstream.script = Script(
        load_capture("llamacpp-completions-sample.txt"),
        inject_after_events=2,
        inject=b"data: " + error + b"\n\n",
    )
    body = {"model": "smol", "prompt": "Hi", "stream_format": "msgpack"}
    async with named.post("/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
    await access_lines(caplog, 2)
    text = [TextFormatter().format(r) for r in caplog.records]
    assert sum("forged" in line for line in text) == 2  # the path's line, the upstream's
    for line in text:
        assert no_control_characters(line), line


# --- URL credentials --------------------------------------------------------------------------

USER, PASSWORD = "alice", "s3cret"


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@")


def shows_credentials(text: str) -> bool:
    return PASSWORD in text or f"{USER}:" in text


async def test_url_credentials_go_upstream_as_basic_auth_and_never_into_a_log_line(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    upstream_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    proxy = await make_proxy(upstream=(with_credentials(upstream_url),))
    async with proxy.post("/v1/embeddings", json={"input": "Hi"}) as resp:
        assert resp.status == 200
        await resp.read()
    body = {"prompt": "Hi", "stream_format": "msgpack"}
    async with proxy.post("/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
    # What aiohttp does with a URL's userinfo, and the proxy always did: Basic authentication
    # (RFC 7617), on relayed, Codec and health-check requests alike.
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    sent = [*upstream.requests, *upstream.health_checks]
    assert [r.headers.get("Authorization") for r in sent] == [basic] * len(sent)
    await access_lines(caplog, 2)
    lines = log_output(caplog)
    access = [line for line in lines if '"upstream":' in line]
    assert len(access) == 2
    assert all(upstream_url.replace("http://", "http://***@") in line for line in access)
    assert not any(shows_credentials(line) for line in lines)


async def test_an_unreachable_upstream_names_its_url_without_credentials(
    make_proxy: MakeProxy,
    unused_tcp_port_factory: Callable[[], int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    # Two upstreams nothing listens on: found unhealthy, then (put back) one is ejected, and
    # the request fails on both.
    down = [with_credentials(f"http://127.0.0.1:{unused_tcp_port_factory()}") for _ in "ab"]
    proxy = await make_proxy(upstream=tuple(down), eject_after=1, health_interval=60)
    pool = default_model(proxy).pool
    for upstream in pool.balancer.upstreams:
        pool.balancer.checked(upstream, healthy=True)
    async with proxy.post("/v1/completions", json={"prompt": "Hi"}) as resp:
        assert resp.status == 502
        assert not shows_credentials(await resp.text())
    async with proxy.get("/readyz") as resp:
        assert not shows_credentials(await resp.text())
    lines = log_output(caplog)
    for needle in ("is now unhealthy", "ejected", "upstream unreachable"):
        found = [line for line in lines if needle in line]
        assert found, needle
        assert "http://***@127.0.0.1:" in found[0]
    assert not any(shows_credentials(line) for line in lines)


def test_a_config_error_names_a_url_without_credentials() -> None:
    env = {
        "CODEC_PROXY_UPSTREAM": f"ftp://{USER}:{PASSWORD}@vllm:8000",
        "CODEC_PROXY_TOKENIZER": "t",
    }
    with pytest.raises(ConfigError) as refused:
        config.load(env=env)
    assert "'ftp://***@vllm:8000'" in refused.value.message
    assert not shows_credentials(refused.value.message)


def test_an_upstream_url_without_a_host_is_named_without_credentials() -> None:
    with pytest.raises(ValueError, match="not an http") as refused:
        Origin.of(f"http://{USER}:{PASSWORD}@")
    assert not shows_credentials(str(refused.value))


def test_the_banner_and_the_settings_show_no_credentials(
    settings: Settings, smollm2_vocabulary: Vocabulary
) -> None:
    secret = replace(settings, upstream=("http://alice:s3cret@vllm:8000",))
    served = create_app(secret, smollm2_vocabulary)[SERVED_MODELS]
    for text in ("\n".join(announcement(secret, served)), repr(secret), config.describe(secret)):
        assert "http://***@vllm:8000" in text
        assert not shows_credentials(text)


# --- request ids ------------------------------------------------------------------------------


def forwarded_id(upstream: FakeUpstream) -> str:
    return {k.lower(): v for k, v in upstream.requests[0].headers.items()}["x-request-id"]


async def test_log_lines_name_the_proxys_id_beside_the_clients(
    named: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    headers = {"X-Request-Id": "client-7"}
    async with named.post("/v1/embeddings", json={"input": "Hi"}, headers=headers) as resp:
        assert resp.headers["X-Request-Id"] == "client-7"  # echoed, as ever
        await resp.read()
    async with named.post("/v1/embeddings", json={"model": "x"}, headers=headers) as resp:
        assert resp.status == 404
    assert forwarded_id(upstream) == "client-7"  # forwarded, as ever
    access = await access_lines(caplog, 2)
    assert [line["client_request_id"] for line in access] == ["client-7", "client-7"]
    own = [line["id"] for line in access]
    assert len(set(own)) == 2
    assert "client-7" not in own
    # The error line of the 404 names both, so it finds its access-log line.
    [error] = [r.getMessage() for r in caplog.records if "-> 404" in r.getMessage()]
    assert f"(request {own[1]} (X-Request-Id client-7))" in error


async def test_a_client_id_unfit_for_logs_is_replaced_not_kept(
    named: ProxyClient, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    headers = {"X-Request-Id": "two words"}
    async with named.post("/v1/embeddings", json={"input": "Hi"}, headers=headers) as resp:
        echoed = resp.headers["X-Request-Id"]
        await resp.read()
    [line] = await access_lines(caplog, 1)
    assert (line["id"], line["client_request_id"]) == (echoed, None)
    assert forwarded_id(upstream) == echoed
