"""`/.well-known/codec/` documents of this issue: the version policy and the safety descriptor.

Both are public, static for the life of the process, and fetched by browsers: JSON with
`Access-Control-Allow-Origin: *`, no `Codec-*` request header needed (WKD, codec-spec.md §3.5,
§12 item 32). The reference `discover_version_policy` does send `Codec-Client-Version`, which
makes browsers preflight, so OPTIONS is answered too.
"""

from __future__ import annotations

from aiohttp import web

from proxy.core.safety.policy import WELL_KNOWN_POLICIES
from proxy.server.errors import json_error
from proxy.server.keys import SAFETY_POLICY, VERSION_POLICY

VERSION_POLICY_PATH = "/.well-known/codec/version-policy.json"
POLICIES_ROUTE = WELL_KNOWN_POLICIES + "/{name:.+}"

_CORS = {"Access-Control-Allow-Origin": "*"}
# WKD's SHOULD for mutable documents; a content-addressed document never changes.
_MUTABLE = "public, max-age=300, stale-while-revalidate=86400"
_IMMUTABLE = "public, max-age=31536000, immutable"
# The version policy can change with a restart; clients may otherwise keep it for an hour.
_VERSION_POLICY_CACHE = "public, max-age=300"


def _document(body: bytes, cache_control: str, etag: str | None = None) -> web.Response:
    headers = {**_CORS, "Cache-Control": cache_control}
    if etag is not None:
        headers["ETag"] = f'"{etag}"'
    return web.Response(body=body, content_type="application/json", headers=headers)


def _not_found(what: str) -> web.Response:
    response = json_error(
        404, f"no {what} is published here", error_type="not_found_error", code="not_found"
    )
    response.headers.update(_CORS)
    return response


async def version_policy(request: web.Request) -> web.Response:
    """404 unless something is enforced (WKD: SHOULD NOT publish otherwise)."""
    document = request.app[VERSION_POLICY].document()
    if document is None:
        return _not_found("version policy")
    return _document(document, _VERSION_POLICY_CACHE)


async def safety_policy(request: web.Request) -> web.Response:
    """`policies/<id>.json` and `policies/sha256/<hex>.json`: the same canonical bytes.

    Only the exact names of the loaded policy are served; nothing touches the filesystem, so
    no path can reach anything else.
    """
    policy = request.app.get(SAFETY_POLICY)
    name = request.match_info["name"]
    if policy is not None:
        if name == f"{policy.id}.json":
            return _document(policy.canonical, _MUTABLE, policy.sha256)
        if name == f"sha256/{policy.sha256}.json":
            return _document(policy.canonical, _IMMUTABLE, policy.sha256)
    return _not_found("safety policy of that name")


async def preflight(request: web.Request) -> web.Response:
    return web.Response(
        status=204,
        headers={
            **_CORS,
            "Access-Control-Allow-Methods": "GET, HEAD, OPTIONS",
            "Access-Control-Allow-Headers": "Codec-Client-Version",
            "Access-Control-Max-Age": "86400",
        },
    )


def routes() -> list[web.RouteDef]:
    return [
        web.get(VERSION_POLICY_PATH, version_policy),
        web.options(VERSION_POLICY_PATH, preflight),
        web.get(POLICIES_ROUTE, safety_policy),
        web.options(POLICIES_ROUTE, preflight),
    ]
