"""Long token-ID prompts: more than `max_prompt_ids` is a 413 before the upstream is contacted,
the default is the backend's context length, and parsing a long one never stalls the event loop
(`/livez` keeps answering)."""

from __future__ import annotations

import asyncio
import http.client
import io
import json
import threading
import time
from typing import Any

import msgpack
import orjson
import pytest
from yarl import URL

from proxy.core.wire import codec_pb2
from proxy.settings import DEFAULT_MAX_PROMPT_IDS
from tests.fake_upstream import FakeUpstream
from tests.server.conftest import MakeProxy, ProxyClient
from tests.server.support import post

PATH_B = "/v1/completions/codec"
MSGPACK = {"Content-Type": "application/x-msgpack"}
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def path_a(ids: list[int]) -> tuple[str, bytes, dict[str, str]]:
    body = orjson.dumps({"prompt": ids, "stream_format": "msgpack", "max_tokens": 8})
    return "/v1/completions", body, {"Content-Type": "application/json"}


def path_b_msgpack(ids: list[int]) -> tuple[str, bytes, dict[str, str]]:
    return PATH_B, bytes(msgpack.packb({"prompt_ids": ids})), MSGPACK


def path_b_protobuf(ids: list[int]) -> tuple[str, bytes, dict[str, str]]:
    return PATH_B, codec_pb2.CodecRequest(prompt_ids=ids).SerializeToString(), PROTOBUF


BODIES = [path_a, path_b_msgpack, path_b_protobuf]
BODY_IDS = ["path-a", "path-b-msgpack", "path-b-protobuf"]


async def assert_prompt_too_long(
    proxy: ProxyClient, request: tuple[str, bytes, dict[str, str]]
) -> dict[str, Any]:
    path, body, headers = request
    status, response_headers, raw = await post(proxy, path, data=body, headers=headers)
    assert status == 413
    assert response_headers["Content-Type"].startswith("application/json")
    error: dict[str, Any] = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", "prompt_too_long")
    return error


@pytest.mark.parametrize("make_body", BODIES, ids=BODY_IDS)
async def test_more_ids_than_max_prompt_ids_is_413_before_the_upstream(
    make_proxy: MakeProxy, upstream: FakeUpstream, make_body: Any
) -> None:
    proxy = await make_proxy(max_prompt_ids=4)
    await assert_prompt_too_long(proxy, make_body([1, 2, 3, 4, 5]))
    assert upstream.requests == []
    path, body, headers = make_body([1, 2, 3, 4])
    status, _, _ = await post(proxy, path, data=body, headers=headers)
    assert status == 200


@pytest.mark.parametrize("make_body", BODIES, ids=BODY_IDS)
async def test_without_a_setting_or_a_listing_the_default_applies(
    proxy: ProxyClient, upstream: FakeUpstream, make_body: Any
) -> None:
    error = await assert_prompt_too_long(proxy, make_body([7] * (DEFAULT_MAX_PROMPT_IDS + 1)))
    assert str(DEFAULT_MAX_PROMPT_IDS) in error["message"]
    assert upstream.requests == []


@pytest.mark.parametrize(
    "model_fields",
    [{"max_model_len": 6}, {"meta": {"n_vocab": 49152, "n_ctx": 6}}],
    ids=["vllm", "llama.cpp"],
)
async def test_the_default_is_the_context_length_the_backend_lists(
    make_proxy: MakeProxy, upstream: FakeUpstream, model_fields: dict[str, Any]
) -> None:
    upstream.model_fields = model_fields
    proxy = await make_proxy()
    # Path B looks the model up (after validating), which makes the listing known.
    path, body, headers = path_b_protobuf([1, 2, 3, 4, 5, 6, 7])
    assert (await post(proxy, path, data=body, headers=headers))[0] == 200
    for make_body in BODIES:
        error = await assert_prompt_too_long(proxy, make_body([1, 2, 3, 4, 5, 6, 7]))
        assert "6 accepted" in error["message"]
    assert [r.path_qs for r in upstream.requests] == ["/v1/models", "/v1/completions"]
    # The setting wins over the listing.
    proxy = await make_proxy(max_prompt_ids=7)
    path, body, headers = path_a([1, 2, 3, 4, 5, 6, 7])
    assert (await post(proxy, path, data=body, headers=headers))[0] == 200


# --- the event loop while a long prompt is handled --------------------------------------------

LONG_PROMPT = 2_000_000
# The longest /livez may wait, on a busy CI machine too. Before the fix a 2M-ID prompt held the
# loop for more than a second; since, the worst wait measured is tens of milliseconds.
LIVEZ_BOUND = 0.25


def poll_livez(url: URL, stop: threading.Event, waits: list[float], statuses: set[int]) -> None:
    """Ask /livez every 5 ms from another thread, as a prober outside the process would: its
    requests arrive whatever the proxy's loop is doing, so a blocked loop shows as a wait."""
    assert url.host is not None
    connection = http.client.HTTPConnection(url.host, url.port, timeout=30)
    try:
        while not stop.is_set():
            start = time.perf_counter()
            connection.request("GET", "/livez")
            response = connection.getresponse()
            response.read()
            waits.append(time.perf_counter() - start)
            statuses.add(response.status)
            stop.wait(0.005)
    finally:
        connection.close()


@pytest.mark.parametrize("make_body", [path_a, path_b_protobuf], ids=["path-a", "path-b-protobuf"])
async def test_livez_answers_while_a_2m_id_prompt_is_handled(
    make_proxy: MakeProxy, upstream: FakeUpstream, make_body: Any
) -> None:
    ids = [(i * 7919) % 49152 for i in range(LONG_PROMPT)]
    path, body, headers = make_body(ids)
    proxy = await make_proxy(max_prompt_ids=LONG_PROMPT)
    stop, waits, statuses = threading.Event(), list[float](), set[int]()
    poller = threading.Thread(target=poll_livez, args=(proxy.make_url("/"), stop, waits, statuses))
    poller.start()
    try:
        # aiohttp warns about sending over 1 MiB of bytes at once: a file-like goes in parts.
        status, _, _ = await post(proxy, path, data=io.BytesIO(body), headers=headers)
    finally:
        stop.set()
        await asyncio.to_thread(poller.join)

    assert status == 200
    assert statuses == {200}
    assert len(waits) >= 5, "the prompt was handled before /livez could be asked"
    assert max(waits) < LIVEZ_BOUND, f"/livez waited {max(waits) * 1000:.0f} ms"
    sent = orjson.loads(upstream.requests[-1].body)
    assert sent["prompt"] == ids
