"""What every request goes through (proxy/server/control/edge.py): one middleware and one
response hook, each step a plain call. What the steps do, and in which order, is pinned where
each step is tested (test_api_keys.py, test_connections.py's `Expect`, test_hardening.py's access
log and errors, test_versioning.py's header floors, test_tracing.py)."""

from __future__ import annotations

from proxy.server.control.admin import ADMIN_APP
from tests.server.conftest import MakeProxy, app_of


async def test_a_request_costs_one_middleware_and_one_response_hook(
    make_proxy: MakeProxy,
) -> None:
    proxy = await make_proxy(api_key=("k",), admin_port=1)
    app = app_of(proxy)
    assert (len(app.middlewares), len(app.on_response_prepare)) == (1, 1)
    admin = app[ADMIN_APP]
    assert (len(admin.middlewares), len(admin.on_response_prepare)) == (1, 1)
    async with proxy.post(
        "/v1/completions",
        json={"prompt": "Hi", "stream": True},
        headers={"Authorization": "Bearer k"},
    ) as resp:
        assert resp.status == 200
        assert len(resp.headers["X-Request-Id"]) == 32
        await resp.read()
