"""Backend-reported IDs, checked against the streamed text (proxy/core/stream/backend_ids.py).

The safety property, for every stream shape: the IDs sent render to exactly the text the
backend streamed, plus only bytes that never render (special tokens, stop strings, an
incomplete character at the end). Exactness where the backend reports everything (vLLM), and
fallback spans only where it does not (llama.cpp's multi-byte characters).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.stream.backend_ids import BackendIds
from proxy.core.stream.token_bytes import TokenBytes
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.stream.test_retokenizer import Family, family, texts  # noqa: F401  (fixture)
from tests.fake_upstream import UPSTREAM_FIXTURES, load_capture

Chunk = tuple[str, tuple[int, ...] | None]
EOS = 2  # SmolLM2 <|im_end|>


@pytest.fixture(scope="module")
def bytes_of(smollm2_vocabulary: Vocabulary) -> TokenBytes:
    return smollm2_vocabulary.token_bytes


def run(vocabulary: Vocabulary, chunks: list[Chunk]) -> tuple[list[int], int]:
    ids = BackendIds(vocabulary.scheme, vocabulary.token_bytes)
    out = [i for text, chunk_ids in chunks for i in ids.feed(text, chunk_ids)]
    return out + ids.flush(), ids.retokenized_spans


def rendered(token_bytes: TokenBytes, ids: list[int]) -> bytes:
    pieces = token_bytes.render(ids)
    assert pieces is not None
    return b"".join(pieces)


def vllm_chunks(token_bytes: TokenBytes, ids: list[int], group: list[int]) -> Iterator[Chunk]:
    """vLLM's shape: every sampled ID reported; text held back while a character is incomplete.

    `group` says how many IDs each chunk carries (vLLM sends several per chunk under load).
    """
    held = b""
    start = 0
    sizes = iter(group)
    while start < len(ids):
        size = max(1, next(sizes, 1))
        chunk = ids[start : start + size]
        start += size
        held += rendered(token_bytes, chunk)
        text, held = _complete_utf8(held)
        yield text, tuple(chunk)


def llamacpp_chunks(token_bytes: TokenBytes, ids: list[int]) -> Iterator[Chunk]:
    """llama.cpp's shape (measured): a chunk per complete character run, reporting only the
    last token of it; an incomplete tail is never sent at all."""
    held = b""
    for token_id in ids:
        held += rendered(token_bytes, [token_id])
        text, rest = _complete_utf8(held)
        if not rest:
            yield text, (token_id,)
            held = b""


def _complete_utf8(data: bytes) -> tuple[str, bytes]:
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode(), data[cut:]
        except UnicodeDecodeError:
            continue
    raise AssertionError(f"not UTF-8 with an incomplete tail: {data!r}")


# --- TokenBytes ---------------------------------------------------------------------------------


_TABLES: dict[str, TokenBytes] = {}


@given(text=texts)
def test_token_bytes_render_every_family(family: Family, text: str) -> None:  # noqa: F811
    if family.name not in _TABLES:
        _TABLES[family.name] = TokenBytes.from_tokenizer(family.reference, family.scheme.encoder)
    # The retokenizer's mid-text encoding has no start-of-text prefix space to strip.
    ids = family.scheme.encode(text, at_start=False)
    assert rendered(_TABLES[family.name], ids) == family.normalize(text).encode()


def test_token_bytes_special_tokens_render_nothing(bytes_of: TokenBytes) -> None:
    assert bytes_of.render([1, 2, 0]) == [b"", b"", b""]
    assert bytes_of.render([130]) == [b"\xb5"]  # one byte of an emoji
    assert bytes_of.render([49151, 49152]) is None  # past the vocabulary
    assert bytes_of.vocab_size == 49152


# --- vLLM: complete IDs ---------------------------------------------------------------------------


@given(text=texts, group=st.lists(st.integers(1, 4), max_size=60))
def test_vllm_streams_keep_every_reported_id(
    smollm2_vocabulary: Vocabulary, text: str, group: list[int]
) -> None:
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    ids = [*tokenizer.encode(text, add_special_tokens=False).ids, EOS]
    chunks = list(vllm_chunks(smollm2_vocabulary.token_bytes, ids, group))
    assert run(smollm2_vocabulary, chunks) == (ids, 0)


def test_vllm_capture_ids_are_passed_through(smollm2_vocabulary: Vocabulary) -> None:
    chunks: list[Chunk] = []
    for event in load_capture("vllm-completions-token-ids.txt").events:
        data = event.decode().removeprefix("data: ").strip()
        if data != "[DONE]" and (choices := json.loads(data)["choices"]):
            chunks.append((choices[0]["text"], tuple(choices[0]["token_ids"])))
    expected = [i for _, ids in chunks for i in ids or ()]
    assert run(smollm2_vocabulary, chunks) == (expected, 0)
    assert len(expected) == 24


def test_incomplete_character_at_the_end_is_still_sent(smollm2_vocabulary: Vocabulary) -> None:
    # vLLM reports the byte tokens of a character max_tokens cut; its text never comes.
    assert run(smollm2_vocabulary, [("、", (29917,)), ("", (10391, 112)), ("", (11100,))]) == (
        [29917, 10391, 112, 11100],
        0,
    )


# --- llama.cpp: the last token of a multi-byte character only ------------------------------------


@given(text=texts)
def test_llamacpp_streams_never_contradict_the_text(
    smollm2_vocabulary: Vocabulary, text: str
) -> None:
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    chunks = list(llamacpp_chunks(smollm2_vocabulary.token_bytes, [*ids, EOS]))
    out, spans = run(smollm2_vocabulary, chunks)
    assert rendered(smollm2_vocabulary.token_bytes, out) == text.encode()
    assert out[-1:] == [EOS]
    # Fallback exactly where a chunk's text took more than one token.
    merged = sum(1 for _, chunk_ids in chunks if chunk_ids and len(_) > 0)
    assert (spans > 0) == (merged < len(ids))


def test_llamacpp_emoji_capture_matches_the_model(smollm2_vocabulary: Vocabulary) -> None:
    truth = json.loads((UPSTREAM_FIXTURES / "llamacpp-ground-truth.json").read_text())
    chunks = captured_chunks("llamacpp-completions-emoji-logprobs.txt")
    # The capture reports one ID per emoji (its last byte token) ...
    assert [ids for _, ids in chunks][:3] == [(130,), (446,), (117,)]
    out, spans = run(smollm2_vocabulary, chunks)
    # ... the fallback retokenizes each emoji span, which here is what the model sampled.
    assert out == truth["llamacpp-completions-emoji-logprobs.txt"]["tokens"]
    assert spans == 3


@pytest.mark.parametrize(
    ("capture", "unreported_tail"),
    [
        ("llamacpp-completions-cut-utf8-logprobs.txt", 1),  # max_tokens cut a character
        ("llamacpp-completions-stop-holdback-logprobs.txt", 0),  # " Paris" held for a stop
        ("llamacpp-completions-eos-logprobs.txt", 0),  # <|im_end|> sampled, never rendered
    ],
)
def test_llamacpp_captures_against_the_ground_truth(
    smollm2_vocabulary: Vocabulary, capture: str, unreported_tail: int
) -> None:
    truth = json.loads((UPSTREAM_FIXTURES / "llamacpp-ground-truth.json").read_text())[capture]
    out, _ = run(smollm2_vocabulary, captured_chunks(capture))
    tokens: list[int] = truth["tokens"]
    assert out == tokens[: len(tokens) - unreported_tail]


def captured_chunks(name: str) -> list[Chunk]:
    chunks: list[Chunk] = []
    for event in load_capture(name).events:
        data = event.decode().removeprefix("data: ").strip()
        if data == "[DONE]" or not (choices := json.loads(data)["choices"]):
            continue
        choice = choices[0]
        text = choice.get("text", (choice.get("delta") or {}).get("content")) or ""
        logprobs = choice.get("logprobs")
        ids = tuple(e["id"] for e in logprobs["content"]) if logprobs else None
        chunks.append((text, ids))
    return chunks


# --- shapes ---------------------------------------------------------------------------------------


def test_ids_ahead_of_the_text_wait_for_it(smollm2_vocabulary: Vocabulary) -> None:
    ids = BackendIds(smollm2_vocabulary.scheme, smollm2_vocabulary.token_bytes)
    assert ids.feed("", (7042,)) == []  # " Paris", held back by a possible stop string
    assert ids.feed(" Paris.", (30,)) == [7042, 30]


def test_stale_ids_that_never_rendered_are_sent_in_order(smollm2_vocabulary: Vocabulary) -> None:
    # A tool parser consumed text the IDs stand for; the next chunk's own IDs explain its text.
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    markup = tokenizer.encode("<tool_call>", add_special_tokens=False).ids
    done = tokenizer.encode("Done.", add_special_tokens=False).ids
    assert run(smollm2_vocabulary, [("", tuple(markup)), ("Done.", tuple(done))]) == (
        markup + done,
        0,
    )


@pytest.mark.parametrize(
    "chunks",
    [
        [("Hello", (19556,)), (" world", None)],  # a chunk without IDs
        [("Hello", (19556,)), (" world", (99999,))],  # an ID outside the vocabulary
        [("Hello", (19556,)), (" world", (19556,))],  # IDs for other text
    ],
    ids=["no-ids", "unknown-id", "wrong-ids"],
)
def test_unaccounted_text_is_retokenized(
    smollm2_vocabulary: Vocabulary, chunks: list[Chunk]
) -> None:
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    assert run(smollm2_vocabulary, chunks) == (
        [19556, *tokenizer.encode(" world", add_special_tokens=False).ids],
        1,
    )


def test_a_retokenized_span_spans_chunks_until_ids_check_out(
    smollm2_vocabulary: Vocabulary,
) -> None:
    # " wor" + "ld" retokenized together (one BPE word), then backend IDs resume.
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    out, spans = run(smollm2_vocabulary, [(" wor", None), ("ld", None), ("!", (17,))])
    assert out == [*tokenizer.encode(" world", add_special_tokens=False).ids, 17]
    assert spans == 1


def test_matching_prefix_keeps_backend_ids(smollm2_vocabulary: Vocabulary) -> None:
    # IDs for " Paris" then only the last byte of an emoji: " Paris" keeps its ID.
    ids = BackendIds(smollm2_vocabulary.scheme, smollm2_vocabulary.token_bytes)
    out = ids.feed(" Paris 🐵", (7042, 130)) + ids.flush()
    assert out[0] == 7042
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    assert out[1:] == tokenizer.encode(" 🐵", add_special_tokens=False).ids
