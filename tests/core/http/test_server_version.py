"""The `/codec/version` document (proxy/core/http/server_version.py)."""

from __future__ import annotations

import orjson

from proxy.core.http.server_version import capabilities, version_document
from proxy.core.http.versioning import SERVER_VERSION
from proxy.core.wire.formats import DELTA_FORMATS, SERVED_AS_ASKED


def test_a_served_model_lists_every_format_served_as_asked() -> None:
    served = capabilities(codec_served=True)
    assert served.stream_formats == SERVED_AS_ASKED
    assert "protobuf-delta" not in served.stream_formats  # answered as protobuf
    assert "json" not in served.stream_formats  # not a Codec format
    assert served.delta_varint == any(f in DELTA_FORMATS for f in SERVED_AS_ASKED)


def test_a_model_refused_to_everyone_lists_nothing() -> None:
    refused = capabilities(codec_served=False)
    assert refused.stream_formats == ()
    assert refused.delta_varint is False


def test_the_document_names_only_the_models_that_differ() -> None:
    served, refused = capabilities(codec_served=True), capabilities(codec_served=False)
    alone = orjson.loads(version_document(served, {"a": served, "b": served}))
    assert alone == {
        "version": str(SERVER_VERSION),
        "stream_formats": list(SERVED_AS_ASKED),
        "delta_varint": served.delta_varint,
    }
    mixed = orjson.loads(version_document(served, {"a": served, "off": refused}))
    assert mixed["models"] == {"off": {"stream_formats": [], "delta_varint": False}}
