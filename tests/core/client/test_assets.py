"""Maps and dictionaries are kept only when their bytes hash to the digest a response named."""

from __future__ import annotations

import hashlib

import pytest

from proxy.core.client.assets import CodecAssets, CodecIntegrityError, dictionary_digest
from proxy.maps.publish import publish
from proxy.tokenizers.vocabulary import Vocabulary
from tests.compression_support import shipped_dictionaries


def test_a_map_is_kept_by_the_digest_of_its_bytes(smollm2_vocabulary: Vocabulary) -> None:
    published = publish(
        smollm2_vocabulary.loaded, "test/smollm2", content=smollm2_vocabulary.map_content
    )
    assets = CodecAssets()
    assert assets.map(published.digest) is None
    decoder = assets.add_map(published.digest, published.body)
    assert assets.map(published.digest) is decoder
    assert decoder.map_id == "test/smollm2"
    # A second load of the same map keeps the first decoder.
    assert assets.add_map(published.digest, published.body) is decoder
    with pytest.raises(CodecIntegrityError, match="hashes to sha256:"):
        assets.add_map(published.digest, published.body + b" ")
    other = "0" * 64
    with pytest.raises(CodecIntegrityError, match="hashes to"):
        assets.add_map(other, published.body)
    assert assets.map(other) is None
    # The digest the caller computed as it read the bytes is the one checked.
    with pytest.raises(CodecIntegrityError, match=f"hashes to sha256:{other}"):
        CodecAssets().add_map(published.digest, published.body, sha256=other)
    assert decoder.name == f"test/smollm2 sha256:{published.digest}"


def test_a_forgotten_map_is_loaded_again(smollm2_vocabulary: Vocabulary) -> None:
    published = publish(
        smollm2_vocabulary.loaded, "test/smollm2", content=smollm2_vocabulary.map_content
    )
    assets = CodecAssets()
    first = assets.add_map(published.digest, published.body)
    assets.forget_map(published.digest)
    assert assets.map(published.digest) is None
    assert assets.add_map(published.digest, published.body) is not first


@pytest.mark.parametrize("body", [b'{"encoder": "unknown"}', b"[1, 2]", b"<html>"])
def test_bytes_that_hash_right_but_are_no_map_are_refused(body: bytes) -> None:
    with pytest.raises(CodecIntegrityError, match="no tokenizer map") as refused:
        CodecAssets().add_map(hashlib.sha256(body).hexdigest(), body)
    assert refused.value.code == "not_a_map"


def test_a_map_says_which_dictionaries_its_server_compresses_with(
    smollm2_vocabulary: Vocabulary,
) -> None:
    dictionaries = shipped_dictionaries()
    published = publish(
        smollm2_vocabulary.loaded,
        "test/smollm2",
        dictionaries.records,
        content=smollm2_vocabulary.map_content,
    )
    assets = CodecAssets()
    assert assets.declared_dictionaries(published.digest) == ()
    assets.add_map(published.digest, published.body)
    declared = assets.declared_dictionaries(published.digest)
    assert declared == tuple(
        (record.format, record.hash.removeprefix("sha256:")) for record in dictionaries.records
    )
    assert {fmt for fmt, _ in declared} == {"msgpack", "protobuf"}


def test_a_tampered_map_is_a_hash_mismatch(smollm2_vocabulary: Vocabulary) -> None:
    published = publish(
        smollm2_vocabulary.loaded, "test/smollm2", content=smollm2_vocabulary.map_content
    )
    tampered = published.body.replace(b'"id":"test/smollm2"', b'"id":"test/smollm3"')
    assert tampered != published.body
    with pytest.raises(CodecIntegrityError) as refused:
        CodecAssets().add_map(published.digest, tampered)
    assert refused.value.code == "hash_mismatch"
    assert refused.value.status_hint == 502


def test_a_dictionary_is_kept_by_its_digest() -> None:
    loaded = shipped_dictionaries().for_format("protobuf")
    assert loaded is not None
    assets = CodecAssets()
    assert assets.add_dictionary(loaded.hex_digest, loaded.data) == loaded.data
    assert assets.dictionary(loaded.hex_digest) == loaded.data
    with pytest.raises(CodecIntegrityError, match="zstd dictionary"):
        assets.add_dictionary("1" * 64, loaded.data)


@pytest.mark.parametrize(
    ("header", "digest"),
    [
        ("sha256:" + "ab" * 32, "ab" * 32),
        ("sha256:" + "AB" * 32, None),
        ("sha256:" + "ab" * 8, None),
        ("ab" * 32, None),
        (" sha256:" + "ab" * 32, None),
        (None, None),
    ],
)
def test_the_dictionary_header_codecai_accepts(header: str | None, digest: str | None) -> None:
    assert dictionary_digest(header) == digest
