"""Backend-reported IDs, checked against the streamed text (proxy/core/stream/backend_ids.py).

The safety property, for every stream shape and whatever IDs the backend reports: the frames'
IDs render to exactly the text the backend streamed, plus only bytes that never render (special
tokens, a tool-call region's IDs reported with no text, an incomplete character at the end).
Exactness where the backend reports everything (vLLM), and fallback spans only where it does not
(llama.cpp's multi-byte characters) or where its IDs contradict the text.
"""

from __future__ import annotations

import codecs
import json
from bisect import bisect_right
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.stream.backend_ids import BackendIds
from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.token_bytes import TokenBytes
from proxy.core.stream.transcode import CodecTranscoder
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.stream.test_retokenizer import Family, family, texts  # noqa: F401  (fixture)
from tests.fake_upstream import UPSTREAM_FIXTURES, load_capture

Chunk = tuple[str, tuple[int, ...] | None]
EOS = 2  # SmolLM2 <|im_end|>


@pytest.fixture(scope="module")
def bytes_of(smollm2_vocabulary: Vocabulary) -> TokenBytes:
    return smollm2_vocabulary.token_bytes


def run(
    vocabulary: Vocabulary, chunks: list[Chunk], *, tool_call_turn: bool = False
) -> tuple[list[int], int]:
    ids = BackendIds(vocabulary.scheme, vocabulary.token_bytes)
    out = [i for text, chunk_ids in chunks for i in ids.feed(text, chunk_ids)]
    return out + ids.flush(tool_call_turn=tool_call_turn), ids.retokenized_spans


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
    assert run(smollm2_vocabulary, [("、", (29917,)), ("ア", (10391, 112)), ("", (11100,))]) == (
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
    ("capture", "not_sent"),
    [
        ("llamacpp-completions-cut-utf8-logprobs.txt", 1),  # max_tokens cut a character
        ("llamacpp-completions-stop-holdback-logprobs.txt", 0),  # " Paris" held for a stop
        ("llamacpp-completions-eos-logprobs.txt", 0),  # <|im_end|> sampled, never rendered
        # The matched stop string " has": reported with text "", not part of the answer.
        ("llamacpp-completions-stop-logprobs.txt", 1),
    ],
)
def test_llamacpp_captures_against_the_ground_truth(
    smollm2_vocabulary: Vocabulary, capture: str, not_sent: int
) -> None:
    truth = json.loads((UPSTREAM_FIXTURES / "llamacpp-ground-truth.json").read_text())[capture]
    chunks = captured_chunks(capture)
    out, _ = run(smollm2_vocabulary, chunks)
    tokens: list[int] = truth["tokens"]
    assert out == tokens[: len(tokens) - not_sent]
    # What a JSON client reads of the same stream, to the byte.
    streamed = "".join(text for text, _ in chunks).encode()
    assert rendered(smollm2_vocabulary.token_bytes, out) == streamed


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


# --- IDs that contradict the text -----------------------------------------------------------------

INCENSE, IN, WORLD = 37421, 281, 905  # " incense", " in", " world"


@pytest.mark.parametrize(
    "chunks",
    [
        [(" in", (INCENSE,)), (" world", None)],  # the rest of " incense" never comes
        [(" in", (INCENSE,)), (" world", (WORLD,))],  # ... and the next chunk's IDs are right
        [("", (INCENSE,)), (" in", None), (" world", (WORLD,))],  # reported before its text
    ],
    ids=["no-ids-after", "right-ids-after", "reported-ahead"],
)
def test_an_id_the_later_text_contradicts_is_never_sent(
    smollm2_vocabulary: Vocabulary, chunks: list[Chunk]
) -> None:
    # " in" confirms the start of " incense", " world" contradicts the rest: the client must
    # read " in world", neither " world" nor " incense world".
    out, spans = run(smollm2_vocabulary, chunks)
    assert out == [IN, WORLD]
    assert smollm2_vocabulary.loaded.tokenizer.decode(out) == " in world"
    assert spans == 1


@pytest.mark.parametrize(
    ("chunks", "expected", "spans"),
    [
        # A stop string or a wrong ID: " incense" is not the text, so " in" is retokenized.
        ([(" Paris", (7042,)), (" in", (INCENSE,))], [7042, IN], 1),
        ([(" in", (IN, WORLD))], [IN], 0),  # an ID past the text is dropped
        ([(" in", (IN, WORLD)), ("", (EOS,))], [IN, EOS], 0),  # ... an end-of-turn one is not
        ([("X", (72, 174))], [72, 174], 0),  # the first byte of a character max_tokens cut
        ([("X", (72, 174, 174))], [72], 0),  # not a character's start
        # Reported with no text: a matched stop string (llama.cpp, vLLM), not the answer.
        ([(" Paris", (7042,)), ("", (INCENSE,))], [7042], 0),
        ([("", (INCENSE,))], [], 0),
        ([(" in", (IN,)), ("", (INCENSE, EOS))], [IN, EOS], 0),  # EOS renders nothing
        # ... unless all it claims is a character max_tokens cut, as with text.
        ([("X", (72,)), ("", (174,))], [72, 174], 0),
        # A whole character and a cut one, never streamed: neither is the answer.
        ([("、", (29917,)), ("", (10391, 112)), ("", (11100,))], [29917], 0),
    ],
    ids=[
        "partly-rendered",
        "past-the-text",
        "eos-after",
        "cut-character",
        "two-leads",
        "stop-string",
        "stop-string-only",
        "stop-string-eos",
        "no-text-cut-character",
        "no-text-character",
    ],
)
def test_ids_still_ahead_at_the_end(
    smollm2_vocabulary: Vocabulary, chunks: list[Chunk], expected: list[int], spans: int
) -> None:
    assert run(smollm2_vocabulary, chunks) == (expected, spans)


def test_ids_with_no_text_at_the_end_of_a_tool_call_turn_are_its_region(
    smollm2_vocabulary: Vocabulary,
) -> None:
    # The I-D keeps a tool-call region's IDs in `ids`; the backend streamed it as calls.
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    markup = tuple(tokenizer.encode("<tool_call>{}</tool_call>", add_special_tokens=False).ids)
    chunks: list[Chunk] = [(" Sure.", (7042,)), ("", markup), ("", (EOS,))]
    out, _ = run(smollm2_vocabulary, chunks, tool_call_turn=True)
    assert out[-len(markup) - 1 :] == [*markup, EOS]
    # Any other turn: text nobody streamed.
    out, _ = run(smollm2_vocabulary, chunks)
    assert not set(markup) & set(out[1:])


def test_ids_reported_without_text_follow_an_open_span(smollm2_vocabulary: Vocabulary) -> None:
    # An emoji span (llama.cpp reported its last byte token only), then a tool-call region a
    # parser consumed, then text: the region's IDs keep their place between the two.
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    markup = tuple(tokenizer.encode("<tool_call>", add_special_tokens=False).ids)
    done = tuple(tokenizer.encode(" Done.", add_special_tokens=False).ids)
    out, spans = run(smollm2_vocabulary, [("🐵", (130,)), ("", markup), (" Done.", done)])
    assert out == [*tokenizer.encode("🐵", add_special_tokens=False).ids, *markup, *done]
    assert spans == 1


# --- any split, any corruption --------------------------------------------------------------------


def chunked(token_bytes: TokenBytes, text: str, ids: list[int], cuts: list[int]) -> list[Chunk]:
    """`text` cut at character positions; each ID goes with the chunk its first byte is in, so
    IDs run ahead of the text where a token spans a cut (as vLLM's do)."""
    bounds = sorted({0, *(cut for cut in cuts if 0 < cut < len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, [*bounds[1:], len(text)], strict=True)]
    starts = [len(text[:bound].encode()) for bound in bounds]
    grouped: list[list[int]] = [[] for _ in pieces]
    offset = 0
    for token_id in ids:
        grouped[bisect_right(starts, offset) - 1].append(token_id)
        offset += len(rendered(token_bytes, [token_id]))
    return [(piece, tuple(group)) for piece, group in zip(pieces, grouped, strict=True)]


@given(text=texts.filter(bool), cuts=st.lists(st.integers(1, 80), max_size=12))
def test_ids_running_ahead_of_any_split_are_all_sent(
    smollm2_vocabulary: Vocabulary, text: str, cuts: list[int]
) -> None:
    ids = smollm2_vocabulary.loaded.tokenizer.encode(text, add_special_tokens=False).ids
    chunks = chunked(smollm2_vocabulary.token_bytes, text, ids, cuts)
    assert run(smollm2_vocabulary, [*chunks, ("", (EOS,))]) == ([*ids, EOS], 0)


CORRUPTIONS = ("keep", "wrong", "unknown", "none", "empty", "extra", "drop", "later", "earlier")


def corrupt(data: st.DataObject, chunks: list[Chunk], vocab_size: int) -> list[Chunk]:
    lists = [list(ids or ()) for _, ids in chunks]
    missing = [False] * len(chunks)
    for index in range(len(chunks)):
        ids = lists[index]
        kind = data.draw(st.sampled_from(CORRUPTIONS), label=f"corruption {index}")
        at = data.draw(st.integers(0, len(ids)), label=f"position {index}")
        some_id = data.draw(st.integers(0, vocab_size - 1), label=f"id {index}")
        if kind == "wrong" and ids:
            ids[min(at, len(ids) - 1)] = some_id
        elif kind == "unknown":
            ids.insert(at, vocab_size + some_id)
        elif kind == "none":
            missing[index] = True
        elif kind == "empty":
            ids.clear()
        elif kind == "extra":
            ids.insert(at, some_id)
        elif kind == "drop" and ids:
            del ids[min(at, len(ids) - 1)]
        elif kind == "later" and ids and index + 1 < len(chunks):  # reported a chunk late
            lists[index + 1].insert(0, ids.pop())
        elif kind == "earlier" and ids and index:  # reported a chunk early
            lists[index - 1].append(ids.pop(0))
    return [
        (text, None if gone else tuple(ids))
        for (text, _), ids, gone in zip(chunks, lists, missing, strict=True)
    ]


def event(text: str, ids: tuple[int, ...] | None, finish: str | None = None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "text": text, "token_ids": ids, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


@given(text=texts.filter(bool), data=st.data())
def test_frames_decode_to_the_streamed_text_whatever_ids_are_reported(
    smollm2_vocabulary: Vocabulary, text: str, data: st.DataObject
) -> None:
    token_bytes = smollm2_vocabulary.token_bytes
    ids = smollm2_vocabulary.loaded.tokenizer.encode(text, add_special_tokens=False).ids
    cuts = data.draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=12), label="cuts")
    chunks = corrupt(data, chunked(token_bytes, text, ids, cuts), token_bytes.vocab_size)
    if chunks[0][1] is None:  # the first chunk with output decides: backend IDs, always
        chunks[0] = (chunks[0][0], ())
    t = CodecTranscoder(
        smollm2_vocabulary.scheme,
        parse_completion_chunk,
        token_ids="backend",
        token_bytes=token_bytes,
    )
    frames = [frame for piece, piece_ids in chunks for frame in t.feed(event(piece, piece_ids))]
    frames += t.feed(event("", (EOS,), "stop"))
    frames += t.flush()
    assert [frame.done for frame in frames] == [False] * (len(frames) - 1) + [True]
    assert all(frame.ids for frame in frames[:-1])
    assert t.token_source == "backend"
    out = [i for frame in frames for i in frame.ids]
    sent = rendered(token_bytes, out)
    # Exactly the text, save the first bytes of one character that `max_tokens` could have cut
    # (an extra byte token on the last chunk looks just like that).
    assert sent.startswith(text.encode())
    tail = sent[len(text.encode()) :]
    assert len(tail) < 4
    assert codecs.getincrementaldecoder("utf-8")().decode(tail) == ""  # raises if not a start
