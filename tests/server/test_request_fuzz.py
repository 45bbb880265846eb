"""Malformed and odd request bodies against the in-process proxy: never a 5xx, and every 4xx is
the one JSON error shape `{"error": {"message", "type", "code"}}`."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.request_strategies import json_bodies, msgpack_bodies, protobuf_bodies
from tests.server.conftest import ProxyClient

# One proxy serves every example (its state does not carry from one request to the next), so
# the function-scoped fixture is on purpose; the examples are bounded to keep CI fast.
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CODINGS = st.sampled_from([None, None, None, "gzip", "br", "zstd", "identity", "x-unknown"])


async def check(proxy: ProxyClient, path: str, body: bytes, headers: dict[str, str]) -> None:
    async with proxy.post(path, data=body, headers=headers) as resp:
        raw = await resp.read()
        status, content_type = resp.status, resp.headers.get("Content-Type", "")
    assert status < 500, (status, raw[:300])
    if status >= 400:
        assert content_type.startswith("application/json"), (status, raw[:300])
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "code"}
        assert isinstance(error["message"], str)
        assert isinstance(error["type"], str)
        assert error["code"] is None or isinstance(error["code"], str)


@FUZZ
@given(json_bodies, st.sampled_from(["/v1/completions", "/v1/chat/completions"]), CODINGS)
async def test_json_routes(proxy: ProxyClient, body: bytes, path: str, coding: str | None) -> None:
    headers = {"Content-Type": "application/json"}
    if coding is not None:  # a coding the body does not have: refused, never a 500
        headers["Content-Encoding"] = coding
    await check(proxy, path, body, headers)


@FUZZ
@given(
    st.one_of(
        msgpack_bodies().map(lambda body: (body, "application/x-msgpack")),
        protobuf_bodies().map(lambda body: (body, "application/x-protobuf")),
        st.tuples(st.binary(max_size=30), st.sampled_from(["", "application/json", "a/b; c"])),
    ),
    CODINGS,
)
async def test_path_b(
    proxy: ProxyClient, body_and_type: tuple[bytes, str], coding: str | None
) -> None:
    body, content_type = body_and_type
    headers = {"Content-Type": content_type}
    if coding is not None:
        headers["Content-Encoding"] = coding
    await check(proxy, "/v1/completions/codec", body, headers)
