"""Every request parser, fed malformed and odd bodies, raises nothing but a `BadRequest` (a 4xx
with a code), and what it accepts becomes an upstream body without any other error."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.endpoints import CHAT, COMPLETIONS
from proxy.core.errors import BadRequest
from proxy.core.http.upstream_body import UpstreamRequest
from proxy.core.wire.codec_request import decode_codec_request
from proxy.core.wire.prompt_ids import PromptLimits
from tests.request_strategies import VOCAB, json_bodies, msgpack_bodies, protobuf_bodies

LIMITS = PromptLimits(VOCAB, 8)


def refused(exc: BadRequest) -> None:
    assert 400 <= exc.status_hint < 500
    assert exc.code


@given(json_bodies, st.sampled_from([COMPLETIONS, CHAT]), st.booleans())
def test_path_a_parsers(raw: bytes, endpoint: object, ask_for_ids: bool) -> None:
    assert endpoint is COMPLETIONS or endpoint is CHAT
    try:
        parsed = endpoint.parse_request(raw, LIMITS)
        if parsed.is_codec:  # nesting too deep to write again is a BadRequest too
            parsed.upstream().body(model="m", ask_for_ids=ask_for_ids)
    except BadRequest as exc:
        refused(exc)


@given(
    st.one_of(
        msgpack_bodies().map(lambda body: (body, "application/x-msgpack")),
        protobuf_bodies().map(lambda body: (body, "application/x-protobuf")),
        st.tuples(st.binary(max_size=20), st.sampled_from(["", "text/plain", "application/json"])),
    )
)
def test_path_b_parser(body_and_type: tuple[bytes, str]) -> None:
    body, content_type = body_and_type
    try:
        parsed = decode_codec_request(body, content_type, LIMITS)
    except BadRequest as exc:
        refused(exc)
        return
    assert 0 < len(parsed.prompt_ids) <= LIMITS.max_ids
    assert all(0 <= i < VOCAB for i in parsed.prompt_ids)
    UpstreamRequest("completions", parsed.completion_fields()).body(model="m", ask_for_ids=True)
