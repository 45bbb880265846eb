"""The routes that generate text: JSON passes through, a binary `stream_format` becomes Codec.

* `POST /v1/completions` and `POST /v1/chat/completions` (Path A): JSON requests pass through
  byte for byte (policed when a safety policy is on); a binary `stream_format` is served as
  Codec frames of the generated tokens. Chat keeps its template on the backend, so roles never
  reach the wire; tool calls ride on the frames (codec-spec.md §3.2, §12 item 37).
* `POST /v1/completions/codec` (Path B, codec-spec.md §3.3): a binary `CodecRequest`; its
  `prompt_ids` go to the backend's `/v1/completions` as a token-ID prompt, never detokenized
  (§9), and the same frames come back.

What differs between completions and chat is one row of `proxy.core.endpoints`.

A body can be 32 MiB of token IDs. Decoding and parsing one is CPU work of up to seconds, so
bodies from `_OFF_LOOP_BYTES` on go to a worker thread: the core parsers work in slices of
a few milliseconds, and between two slices the thread hands the interpreter back, so every
other stream and `/livez` keep being served meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import orjson
from aiohttp import web

from proxy.core.backend.routing import MODEL_HEADER
from proxy.core.endpoints import (
    CHAT,
    COMPLETIONS,
    Endpoint,
    endpoint_for,
    generates_unpoliced_text,
    is_codec_request,
)
from proxy.core.errors import Forbidden, ProxyError
from proxy.core.http.body_coding import decode_body
from proxy.core.http.json_body import parse_json_object
from proxy.core.http.request import LimitsFor
from proxy.core.http.upstream_body import UpstreamRequest
from proxy.core.shown import quoted
from proxy.core.wire.codec_request import decode_codec_request
from proxy.core.wire.prompt_ids import PromptLimits
from proxy.server.control.codec import codec_plan, serve_codec
from proxy.server.control.codec_upstream import relay_codec_request, serve_from_codec
from proxy.server.control.headers import combined_header, request_target
from proxy.server.control.policed_json import police_json
from proxy.server.control.relay import relay
from proxy.server.control.request_body import read_request_body
from proxy.server.models.live import config_of
from proxy.server.models.served_models import ServedModel, route_request
from proxy.server.telemetry.request_trace import TRACE

T = TypeVar("T")

# Below this a body is decoded and parsed in well under a millisecond: not worth a thread.
_OFF_LOOP_BYTES: Final = 64 * 1024


async def off_loop(size: int, work: Callable[[], T]) -> T:
    """`work()`, in a worker thread when it handles `size` bytes or more."""
    if size < _OFF_LOOP_BYTES:
        return work()
    return await asyncio.to_thread(work)


def model_limits(request: web.Request, model: ServedModel) -> PromptLimits:
    """`model`'s prompt limits: its vocabulary and `max_prompt_ids` (else its backend's
    context length, else the default)."""
    return model.prompt_limits(config_of(request).model(model.name).max_prompt_ids)


def prompt_limits(request: web.Request) -> LimitsFor:
    """The limits of the model a body's fields name, routing the request on the way."""

    def limits(fields: Mapping[str, Any]) -> PromptLimits:
        # Routed here, not only after parsing: a Codec body's unknown model is refused from
        # inside the parser, and the refusal must still be labelled `unknown` in metrics and
        # the access log (a bare `route` left it `none`, as if no model applied).
        return model_limits(request, route_request(request, fields.get("model")))

    return limits


async def read_body(request: web.Request) -> tuple[bytes, bytes]:
    """The body as sent and decoded, each capped at max_body_bytes (413 beyond it).

    The app reads bodies without aiohttp's decompression (client_max_size caps the raw bytes):
    pass-through sends the body as it was sent, Codec requests are parsed from the decoded one.
    The body must arrive within request_timeout (408).
    """
    raw = await read_request_body(request)
    coding = combined_header(request, "Content-Encoding")
    max_bytes = config_of(request).settings.max_body_bytes
    decoded = await off_loop(
        _decoding_work(raw, coding), lambda: decode_body(raw, coding, max_bytes=max_bytes)
    )
    return raw, decoded


def _decoding_work(raw: bytes, coding: str | None) -> int:
    """How many bytes decoding `raw` handles, for `off_loop`: a small compressed body can
    decode to max_body_bytes, so it always goes off the loop."""
    return len(raw) if coding is None else max(len(raw), _OFF_LOOP_BYTES)


# The GenAI conventions' `gen_ai.operation.name` of each generation endpoint, for traces.
_OPERATIONS: Final = {COMPLETIONS.name: "text_completion", CHAT.name: "chat"}


def _traced(request: web.Request, endpoint: Endpoint, model: object) -> None:
    """A traced request is a generation: its operation and the model it names."""
    trace = request.get(TRACE)
    if trace is not None:
        trace.generation(_OPERATIONS[endpoint.name], model if isinstance(model, str) else None)


async def _path_a(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    raw, body = await read_body(request)
    limits = prompt_limits(request)
    parsed = await off_loop(len(body), lambda: endpoint.parse_request(body, limits))
    model = route_request(request, parsed.body.get("model"))
    _traced(request, endpoint, parsed.body.get("model"))
    if model.speaks_codec:
        return await _from_codec_upstream(
            request, endpoint, model, raw, parsed.body, codec=parsed.is_codec
        )
    if not parsed.is_codec:
        # JSON is not Codec traffic: never refused for its version. Passed through byte for
        # byte (coding and all) unless a safety policy must read it.
        renamed = _renamed(parsed.body, model)
        policy = config_of(request).safety_policy(model.name)
        if policy is not None:
            return await police_json(
                request, body if renamed is None else renamed, endpoint, policy
            )
        return await _relay_renamed(request, raw, renamed)
    plan = codec_plan(
        request,
        endpoint,
        upstream_path=request_target(request),
        upstream=parsed.upstream(),
        stream_format=parsed.stream_format,
    )
    return await serve_codec(request, plan)


async def _from_codec_upstream(
    request: web.Request,
    endpoint: Endpoint,
    model: ServedModel,
    raw: bytes,
    fields: dict[str, Any],
    *,
    codec: bool,
) -> web.StreamResponse:
    """A model whose upstream speaks Codec (server/control/codec_upstream.py): a Codec client's
    request goes up as it is; a JSON one is asked as Codec and rendered, or relayed."""
    renamed = _renamed(fields, model)
    if codec:
        if renamed is None:
            return await relay_codec_request(request, model, raw)
        return await relay_codec_request(request, model, renamed, drop=("content-encoding",))
    if renamed is not None:
        fields = {**fields, "model": model.config.upstream_model}
    return await serve_from_codec(
        request, endpoint, fields, lambda: _relay_renamed(request, raw, renamed)
    )


def _renamed(fields: Mapping[str, Any], model: ServedModel) -> bytes | None:
    """A JSON body's `fields` with `model` as the upstream knows it (`upstream_model`), the one
    change a JSON body gets on its way, generation route or relayed; None when nothing
    changes."""
    name = model.config.upstream_model
    if name is None or fields.get("model") == name:
        return None
    return orjson.dumps({**fields, "model": name})


async def _relay_renamed(
    request: web.Request, raw: bytes, renamed: bytes | None
) -> web.StreamResponse:
    """`raw` as it was sent, or the `renamed` body, decoded: its coding no longer applies."""
    if renamed is None:
        return await relay(request, body=raw)
    return await relay(request, body=renamed, drop=("content-encoding",))


async def completions(request: web.Request) -> web.StreamResponse:
    return await _path_a(request, COMPLETIONS)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _path_a(request, CHAT)


async def completions_codec(request: web.Request) -> web.StreamResponse:
    model = route_request(request, request.headers.get(MODEL_HEADER))
    _traced(request, COMPLETIONS, request.headers.get(MODEL_HEADER))
    raw, body = await read_body(request)
    if model.speaks_codec:
        # The upstream reads Path B itself; its prompt IDs are checked there, against its map.
        return await relay_codec_request(request, model, raw)
    content_type = request.headers.get("Content-Type")
    limits = model_limits(request, model)
    parsed = await off_loop(len(body), lambda: decode_codec_request(body, content_type, limits))
    plan = codec_plan(
        request,
        COMPLETIONS,
        upstream_path=COMPLETIONS.upstream_path,
        upstream=UpstreamRequest(COMPLETIONS.name, parsed.completion_fields()),
        stream_format=parsed.stream_format,
        resolve_model=True,
    )
    return await serve_codec(request, plan)


async def other_routes(request: web.Request) -> web.StreamResponse:
    """Every other path, any method.

    A spelling of a generation route the router did not match (`/v1/completions/`,
    `//completions`, `/V1/completions/codec`) is served as that route: the backend's router may
    well accept what ours did not, and behind a backend that serves Codec itself such a
    spelling went past the rollout switches. With a safety policy loaded, a generation route
    the policy cannot read is refused. Everything else is relayed (`_relay_other`).
    """
    if request.method == "POST":
        if is_codec_request(request.raw_path):
            return await completions_codec(request)
        endpoint = endpoint_for(request.raw_path)
        if endpoint is not None:
            return await _path_a(request, endpoint)
        if config_of(request).safety_policies and generates_unpoliced_text(request.raw_path):
            raise Forbidden(
                f"{quoted(request.path)} generates text the safety policy cannot check; use "
                "/v1/completions or /v1/chat/completions",
                code="route_not_policed",
            )
    return await _relay_other(request)


async def _relay_other(request: web.Request) -> web.StreamResponse:
    """Relayed as it is, to the model its JSON body names, compressed or not, and with that
    name changed to the model's `upstream_model` as on the generation routes. A body that
    names no model goes to the one `Codec-Model` names, else to the default; so does one the
    proxy cannot read for its model (not a JSON object, a coding it cannot undo), except that
    with several models it is refused unless `Codec-Model` names one (core/backend/routing.py).
    """
    raw = await read_request_body(request)
    fields = await _json_object(request, raw) if raw else None
    named = None if fields is None else fields.get("model")
    if named is None:
        named = request.headers.get(MODEL_HEADER)
    model = route_request(request, named, unread_body=bool(raw) and fields is None)
    if fields is None:
        return await relay(request, body=raw)
    return await _relay_renamed(request, raw, _renamed(fields, model))


async def _json_object(request: web.Request, raw: bytes) -> dict[str, Any] | None:
    """A relayed body as the JSON object it holds, its content coding undone; None when it is
    not one, or its coding is one we do not know, corrupt, or decodes past max_body_bytes."""
    coding = combined_header(request, "Content-Encoding")
    max_bytes = config_of(request).settings.max_body_bytes

    def parse() -> dict[str, Any] | None:
        try:
            return parse_json_object(decode_body(raw, coding, max_bytes=max_bytes))
        except ProxyError:
            return None

    return await off_loop(_decoding_work(raw, coding), parse)
