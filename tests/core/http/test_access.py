"""The rollout switches: who gets Codec, decided before any upstream contact."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.http.access import CODEC_NOT_ENABLED, CodecAccess, CodecNotEnabled


def refusal(access: CodecAccess, *, key: str = "", client: str | None = None,
            model_enabled: bool = True) -> str | None:  # fmt: skip
    """The reason `access` refuses this request, or None when it may have Codec."""
    refused: CodecNotEnabled | None = None
    try:
        access.check(model="m", model_enabled=model_enabled, key=key, client=client)
    except CodecNotEnabled as exc:
        refused = exc
    if refused is None:
        return None
    assert (refused.status_hint, refused.code, refused.param) == (
        403, CODEC_NOT_ENABLED, "stream_format"
    )  # fmt: skip
    assert "without stream_format" in (refused.public_message or "")
    return refused.reason


def test_the_default_is_codec_for_everyone_who_asks() -> None:
    assert refusal(CodecAccess()) is None
    assert refusal(CodecAccess(), key="k", client="app/1") is None


def test_off_globally_and_per_model() -> None:
    assert refusal(CodecAccess(enabled=False)) == "disabled"
    assert refusal(CodecAccess(), model_enabled=False) == "model_disabled"


def test_keys_allow_and_deny() -> None:
    access = CodecAccess(allow_keys=("good", "also"), deny_keys=("bad",))
    assert refusal(access, key="good") is None
    assert refusal(access, key="other") == "key_not_allowed"
    assert refusal(access, key="") == "key_not_allowed"
    assert refusal(CodecAccess(deny_keys=("bad",)), key="bad") == "key_denied"
    assert refusal(CodecAccess(deny_keys=("bad",)), key="good") is None


def test_clients_allow_and_deny_with_prefixes() -> None:
    access = CodecAccess(allow_clients=("chat-ui/*", "batch"), deny_clients=("chat-ui/0.9",))
    assert refusal(access, client="chat-ui/1.2") is None
    assert refusal(access, client="batch") is None
    assert refusal(access, client="batch-2") == "client_not_allowed"
    assert refusal(access, client=None) == "client_not_allowed"
    assert refusal(access, client="chat-ui/0.9") == "client_denied"


@given(st.text(max_size=20), st.text(max_size=20))
def test_a_deny_always_wins(key: str, client: str) -> None:
    access = CodecAccess(
        allow_keys=(key or "x",), deny_keys=(key or "x",),
        allow_clients=(client,), deny_clients=(client,),
    )  # fmt: skip
    assert refusal(access, key=key or "x", client=client) in {"key_denied", "client_denied"}
