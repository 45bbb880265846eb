"""What a reload widens (`proxy/reloading.py`): the one decision, and which widenings come only
from settings the configuration leaves out."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from proxy.config import read
from proxy.reloading import Widening, unstated, widenings
from proxy.settings import ModelSettings, Settings

BASE = Settings(upstream=("http://a",), tokenizer=Path("t"))
KEYS = frozenset({"k1", "k2"})


def widened(
    before: dict[str, Any],
    after: dict[str, Any],
    keys: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset()),
) -> list[str]:
    running = dataclasses.replace(BASE, **before)
    new = dataclasses.replace(BASE, **after)
    return [str(w) for w in widenings(running, keys[0], new, keys[1])]


WIDENING = {
    "every API key removed": (
        {"api_key": ("k1",), "api_key_file": Path("keys")},
        {},
        (KEYS, frozenset()),
        ["every API key removed: no key needed (api_key and api_key_file)"],
    ),
    "an API key added": (
        {"api_key_file": Path("keys")},
        {"api_key_file": Path("keys")},
        (frozenset({"k1"}), KEYS),
        ["1 API key added (api_key_file)"],
    ),
    "keys forwarded upstream": (
        {"api_key": ("k1",)},
        {"api_key": ("k1",), "forward_authorization": True},
        (frozenset({"k1"}), frozenset({"k1"})),
        ["clients' API keys sent upstream (forward_authorization)"],
    ),
    "Codec switched on": (
        {"codec_enabled": False},
        {},
        (frozenset(), frozenset()),
        ["Codec switched on (codec_enabled)"],
    ),
    "an allow-list emptied": (
        {"codec_allow_keys": ("a", "b")},
        {"codec_allow_keys": ()},
        (frozenset(), frozenset()),
        ["allow-list emptied: every key gets Codec (codec_allow_keys)"],
    ),
    "an allow-list grown": (
        {"codec_allow_clients": ("chat-ui/*",)},
        {"codec_allow_clients": ("chat-ui/*", "batch", "cli")},
        (frozenset(), frozenset()),
        ["2 clients added to the allow-list (codec_allow_clients)"],
    ),
    "a deny-list shortened": (
        {"codec_deny_keys": ("a", "b", "c")},
        {"codec_deny_keys": ("b",)},
        (frozenset(), frozenset()),
        ["2 keys removed from the deny-list (codec_deny_keys)"],
    ),
    "a deny-list emptied": (
        {"codec_deny_clients": ("bot",), "codec_client_header": "X-Client"},
        {"codec_client_header": "X-Client"},
        (frozenset(), frozenset()),
        ["deny-list emptied (codec_deny_clients)"],
    ),
    "the client header changed under a deny-list": (
        {"codec_deny_clients": ("bot",), "codec_client_header": "X-Client"},
        {"codec_deny_clients": ("bot",), "codec_client_header": "User-Agent"},
        (frozenset(), frozenset()),
        ["denied clients named by another header (codec_client_header)"],
    ),
    "the safety policy removed and unenforced": (
        {"safety_policy": Path("p.toml"), "enforce_safety_policy": True},
        {},
        (frozenset(), frozenset()),
        [
            "safety policy removed (safety_policy)",
            "safety policy no longer enforced (enforce_safety_policy)",
        ],
    ),
    "the version floor relaxed": (
        {"version_policy": "strict"},
        {"version_policy": "advisory"},
        (frozenset(), frozenset()),
        ["version floor no longer enforced (version_policy)"],
    ),
    "compression turned back on": (
        {"uncompressed": True, "uncompressed_keys": ("a", "b")},
        {"uncompressed_keys": ("b",)},
        (frozenset(), frozenset()),
        [
            "responses compressed again (uncompressed)",
            "responses to 1 key compressed again (uncompressed_keys)",
        ],
    ),
}


@pytest.mark.parametrize(("before", "after", "keys", "expected"), WIDENING.values(), ids=WIDENING)
def test_what_widens_access(
    before: dict[str, Any],
    after: dict[str, Any],
    keys: tuple[frozenset[str], frozenset[str]],
    expected: list[str],
) -> None:
    assert widened(before, after, keys) == expected


NARROWING = {
    "keys where there were none": ({}, {"api_key": ("k1",)}, (frozenset(), frozenset({"k1"}))),
    "a key revoked": ({"api_key": ("k1", "k2")}, {"api_key": ("k2",)}, (KEYS, frozenset({"k2"}))),
    "Codec switched off": ({}, {"codec_enabled": False}, (frozenset(), frozenset())),
    "an allow-list where there was none": ({}, {"codec_allow_keys": ("a",)}, (frozenset(),) * 2),
    "an allow-list shortened": (
        {"codec_allow_keys": ("a", "b")},
        {"codec_allow_keys": ("a",)},
        (frozenset(), frozenset()),
    ),
    "a deny-list grown": ({"codec_deny_keys": ("a",)}, {"codec_deny_keys": ("a", "b")}, (
        frozenset(), frozenset())),
    "a header for a deny-list that had none": (
        {"codec_deny_clients": ("bot",)},
        {"codec_deny_clients": ("bot",), "codec_client_header": "X-Client"},
        (frozenset(), frozenset()),
    ),
    "the version floor enforced": ({}, {"version_policy": "strict"}, (frozenset(), frozenset())),
    "responses left uncompressed": ({}, {"uncompressed": True, "uncompressed_keys": ("a",)}, (
        frozenset(), frozenset())),
    "forwarding without keys": ({}, {"forward_authorization": True}, (frozenset(), frozenset())),
    "a policy replaced": (
        {"safety_policy": Path("a.toml")},
        {"safety_policy": Path("b.toml")},
        (frozenset(), frozenset()),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("before", "after", "keys"), NARROWING.values(), ids=NARROWING)
def test_what_does_not_widen_access(
    before: dict[str, Any], after: dict[str, Any], keys: tuple[frozenset[str], frozenset[str]]
) -> None:
    assert widened(before, after, keys) == []


def test_a_model_switched_on_is_named() -> None:
    model = ModelSettings(name="qwen", upstreams=("http://q",), tokenizer=Path("q"))
    many = Settings(models=(dataclasses.replace(model, codec_enabled=False),))
    on = dataclasses.replace(many, models=(model,))
    [widening] = widenings(many, frozenset(), on, frozenset())
    assert widening == Widening("Codec switched on for model qwen", ("models[qwen].codec_enabled",))
    assert widenings(on, frozenset(), many, frozenset()) == ()
    # A model's responses compressed again, its own setting dropped.
    left_out = dataclasses.replace(many, models=(dataclasses.replace(model, uncompressed=True),))
    [widening] = widenings(left_out, frozenset(), many, frozenset())
    assert widening == Widening(
        "responses of model qwen compressed again", ("models[qwen].uncompressed",)
    )
    # Its own setting dropped where the top level leaves every model uncompressed: no change.
    everywhere = dataclasses.replace(many, uncompressed=True)
    assert widenings(dataclasses.replace(left_out, uncompressed=True), frozenset(), everywhere,
                     frozenset()) == ()  # fmt: skip


def test_a_widening_is_unstated_when_a_setting_it_comes_from_is_left_out() -> None:
    keys = Widening("every API key removed: no key needed", ("api_key", "api_key_file"))
    codec = Widening("Codec switched on", ("codec_enabled",))
    assert unstated([keys, codec], {"api_key", "codec_enabled"}) == (keys,)
    assert unstated([keys, codec], {"api_key", "api_key_file"}) == (codec,)
    assert unstated([keys, codec], {"api_key", "api_key_file", "codec_enabled"}) == ()
    assert unstated([keys, codec], None) == ()  # a Settings handed over whole is meant


def test_the_sources_say_which_settings_they_state(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        'api_key = []\ncodec_deny_keys = []\nsafety_policy = "none"\n'
        '[[models]]\nname = "qwen"\nupstreams = ["http://q"]\ntokenizer = "q"\n'
        "codec_enabled = true\n"
    )
    loaded = read(file=file, env={"CODEC_PROXY_PORT": "1"}, flags={"workers": 2})
    assert loaded.stated == {
        "api_key", "codec_deny_keys", "safety_policy", "models", "port", "workers",
        "models[qwen].name", "models[qwen].upstreams", "models[qwen].tokenizer",
        "models[qwen].codec_enabled",
    }  # fmt: skip
    # Models given as objects (`codec-proxy embedded`) state every key of their entries.
    model = ModelSettings(name="m", upstreams=("http://m",), tokenizer=Path("m"))
    given = read(env={}, flags={"models": (model,)}).stated
    assert {"models[m].codec_enabled", "models[m].flush_frames"} <= given
