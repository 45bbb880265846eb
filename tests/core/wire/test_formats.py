"""The stream-format registry (codec-spec.md §1): one list for Path A, Path B and the encoders."""

from __future__ import annotations

import pytest

from proxy.core.errors import BadRequest
from proxy.core.wire.formats import BINARY_FORMATS, SENT_AS, STREAM_FORMATS, check_stream_format
from proxy.core.wire.frames import encoder_for


@pytest.mark.parametrize("fmt", STREAM_FORMATS)
def test_every_listed_format_is_accepted_on_path_a(fmt: str) -> None:
    assert check_stream_format(fmt) == fmt


def test_path_b_refuses_json() -> None:
    with pytest.raises(BadRequest) as caught:
        check_stream_format("json", json_allowed=False)
    assert caught.value.code == "invalid_stream_format"
    assert "json" not in caught.value.message.split("supported values: ")[1]


@pytest.mark.parametrize("value", ["MSGPACK", "cbor", "", 3, None, ["msgpack"]])
def test_anything_else_is_400_listing_the_supported_values(value: object) -> None:
    with pytest.raises(BadRequest) as caught:
        check_stream_format(value)
    assert caught.value.code == "invalid_stream_format"
    assert ", ".join(STREAM_FORMATS) in caught.value.message


@pytest.mark.parametrize("fmt", BINARY_FORMATS)
def test_every_binary_format_is_sent_as_one_that_has_an_encoder(fmt: str) -> None:
    assert encoder_for(SENT_AS[fmt]) is not None
