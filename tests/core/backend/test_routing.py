"""Routing a request's `model` to a configured model: names, aliases, the default, 404."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.backend.routing import UNKNOWN_MODEL, ModelRoutes
from proxy.core.errors import BadRequest, ConfigError, NotFound

ROUTES = ModelRoutes.build([("llama", ("llama", "llama3")), ("qwen", ("qwen",))])


def test_names_and_aliases_route_to_their_model_and_none_to_the_default() -> None:
    assert ROUTES.route("llama") == "llama"
    assert ROUTES.route("llama3") == "llama"
    assert ROUTES.route("qwen") == "qwen"
    assert ROUTES.route(None) == "llama"  # the first listed is the default


def test_an_unknown_name_is_404_model_not_found_in_openais_shape() -> None:
    with pytest.raises(NotFound) as caught:
        ROUTES.route("gpt-4")
    error = caught.value
    assert (error.status_hint, error.code, error.param) == (404, "model_not_found", "model")
    assert error.error_type == "invalid_request_error"
    assert "'gpt-4'" in (error.public_message or "")


def test_a_model_that_is_not_a_string_is_400() -> None:
    with pytest.raises(BadRequest) as caught:
        ROUTES.route(["llama"])
    assert not isinstance(caught.value, NotFound)
    assert caught.value.code == "invalid_type"


def test_one_model_by_upstream_and_tokenizer_serves_any_name() -> None:
    single = ModelRoutes.build([("default", ("default",))], any_name=True)
    assert single.route("whatever/the-client-says") == "default"
    assert single.route(7) == "default"


def test_a_name_given_twice_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="'x' is also 'a'"):
        ModelRoutes.build([("a", ("a", "x")), ("b", ("b", "x"))])


@given(st.text(max_size=40))
def test_labels_are_configured_names_or_unknown(name: str) -> None:
    assert ROUTES.label(name) in {"llama", "qwen", UNKNOWN_MODEL}
    assert ROUTES.label(name) == UNKNOWN_MODEL or name in ROUTES.names
