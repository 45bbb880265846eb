"""The stream verifier: streamed text against IDs decoded with the published map.

The reference is the whole-stream comparison (all the text against all the decoded bytes at
once); the verifier must reach the same verdict, at the same byte, for any interleaving of text
chunks and ID frames, holding only the part one side is ahead by. The IDs come from the real
tokenizers, through the incremental retokenizer where the proxy would use it; codecai's
`Detokenizer` is the oracle for what a client sees.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.retokenizer import Retokenizer
from proxy.core.stream.transcode import CodecTranscoder
from proxy.core.verify.map_decoder import MapDecoder
from proxy.core.verify.verifier import StreamVerifier, Verification
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.verify.conftest import Families, MapFamily
from tests.fake_upstream import load_capture

# --- helpers ----------------------------------------------------------------------------------


def pieces(decoder: MapDecoder, ids: Sequence[int]) -> bytes:
    rendered = [decoder.piece(token_id) for token_id in ids]
    assert None not in rendered
    return b"".join(piece for piece in rendered if piece is not None)


def leading_spaces(data: bytes) -> int:
    return len(data) - len(data.lstrip(b" "))


def cut_character(data: bytes) -> bool:
    """The first bytes of one UTF-8 character, and no more."""
    try:
        data.decode()
    except UnicodeDecodeError as exc:
        return exc.start == 0 and exc.reason == "unexpected end of data"
    return False


def whole(decoder: MapDecoder, text: str, ids: Sequence[int]) -> Verification:
    """The verdict from all of both sides at once (IDs known to the map, none special)."""
    want, got = text.encode(), pieces(decoder, ids)
    if decoder.dummy_prefix and leading_spaces(got) > leading_spaces(want):
        got = got[1:]
    same = 0
    while same < min(len(want), len(got)) and want[same] == got[same]:
        same += 1
    if got == want or (same == len(want) and cut_character(got[same:])):
        return Verification(True, None, len(want))
    return Verification(False, same, same)


def run(
    decoder: MapDecoder,
    deltas: Sequence[str],
    frames: Sequence[Sequence[int]],
    order: Sequence[bool] | None = None,
    finish: str | None = "eos_token",
) -> Verification:
    """Feed text deltas and ID frames in `order` (True: the next delta), by default all the
    text first."""
    verifier = StreamVerifier(decoder)
    texts, batches = iter(deltas), iter(frames)
    for is_text in order if order is not None else [True] * len(deltas) + [False] * len(frames):
        if is_text:
            verifier.text(next(texts, ""))
        else:
            verifier.ids(next(batches, ()))
    for delta in texts:
        verifier.text(delta)
    for batch in batches:
        verifier.ids(batch)
    return verifier.flush(finish)


def retokenized(
    families: Families, name: str, deltas: Sequence[str], end: Sequence[int] = ()
) -> Verification:
    """The transcoder's way: each delta's text, then the IDs the retokenizer makes final."""
    decoder = families.map(name).decoder
    retokenizer = Retokenizer(families.scheme(name))
    verifier = StreamVerifier(decoder)
    for delta in deltas:
        verifier.text(delta)
        verifier.ids(retokenizer.feed(delta))
    verifier.ids([*retokenizer.flush(), *end])
    return verifier.flush("eos_token")


def split_at(text: str, cuts: Sequence[int]) -> list[str]:
    bounds = [0, *sorted({min(max(c, 0), len(text)) for c in cuts}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def end_of_turn(family: MapFamily) -> int:
    eos = [i for i in family.loaded.eos_token_ids if i in family.decoder.special]
    return eos[0] if eos else min(family.decoder.special)


AGREED_WHOLE = Verification(True, None, 0)

# --- every split point of the trap texts, through the retokenizer ---------------------------

# Multi-byte UTF-8 (CJK, emoji that byte-level BPE splits into byte tokens, ZWJ sequences, flags),
# SentencePiece leading spaces and space runs, special and added token text inside text,
# contractions and newline runs; text a tokenizer would give back otherwise (Qwen3 normalizes to
# NFC, SentencePiece stores a space as "▁"), which the retokenizer spells in byte tokens.
TRAPS = [
    "价格是 1234.56 元，对吗？日本語も。🎉🎉 👨\u200d👩\u200d👧 done",
    " Leading space, then  two and   three.",
    "  \n\n indented\tx  ",
    "special <|im_end|> and <think>reasoning</think> <|endoftext|>",
    "We're here, aren't we? I'll say: 'yes'.\n\n\n",
    "🇫🇷🎉é\u00a0ñ—“quotes”",
    "cafe\u0301 \u212b\u2126 x\u0344y \u0958 e\u0323\u0307.",
    "\u2581Lead \u2581 a\u2581b \u2581\u2581  x\u2581",
]
TRAP_FAMILIES = ("smollm2", "mistral.json", "qwen3.json", "llama3.json")


@pytest.mark.parametrize("name", TRAP_FAMILIES)
@pytest.mark.parametrize("text", TRAPS)
def test_every_split_point_of_a_trap_text_agrees(families: Families, name: str, text: str):
    size = len(text.encode())
    eot = end_of_turn(families.map(name))
    for cut in range(len(text) + 1):
        deltas = [text[:cut], text[cut:]]
        assert retokenized(families, name, deltas) == Verification(True, None, size), cut
        # An end-of-turn token renders as nothing: still the text.
        assert retokenized(families, name, deltas, [eot]).agreed, cut
    for a in range(0, len(text), 3):
        for b in range(a, len(text), 5):
            deltas = [text[:a], text[a:b], text[b:]]
            assert retokenized(families, name, deltas).agreed, (a, b)


def test_one_character_at_a_time(families: Families) -> None:
    for name in TRAP_FAMILIES:
        for text in TRAPS:
            assert retokenized(families, name, list(text)).agreed, (name, text)


# --- any interleaving, any corruption: the same verdict as the whole stream -----------------

characters = st.characters(
    exclude_categories=("Cs", "Co", "Cn", "Cc"), exclude_characters="\u2581\ufffd"
)
texts = st.lists(
    st.one_of(st.sampled_from(["🎉", "日本", " ", "  ", "\n", "é", "'s"]), st.text(characters)),
    max_size=12,
).map("".join)


@pytest.fixture(params=["smollm2", "mistral.json"], scope="module")
def family(request: pytest.FixtureRequest, families: Families) -> MapFamily:
    name: str = request.param
    return families.map(name)


@st.composite
def corrupted(draw: st.DrawFn, ids: list[int], decoder: MapDecoder) -> list[int]:
    """The IDs with one replaced, dropped or added (an ID with bytes), or as they were."""
    kind = draw(st.sampled_from(["none", "replace", "drop", "insert"]))
    if kind == "none" or (kind != "insert" and not ids):
        return ids
    other = draw(
        st.integers(0, decoder.size - 1).filter(lambda i: bool(decoder.piece(i))), label="other"
    )
    at = draw(st.integers(0, len(ids) - (kind != "insert")), label="at")
    if kind == "replace":
        return [*ids[:at], other, *ids[at + 1 :]]
    if kind == "drop":
        return [*ids[:at], *ids[at + 1 :]]
    return [*ids[:at], other, *ids[at:]]


@given(data=st.data())
def test_any_interleaving_gives_the_whole_stream_verdict(
    family: MapFamily, families: Families, data: st.DataObject
) -> None:
    text = data.draw(texts, label="text")
    decoder = family.decoder
    ids = data.draw(corrupted(family.encode(text), decoder), label="ids")
    deltas = split_at(text, data.draw(st.lists(st.integers(0, len(text))), label="text cuts"))
    id_cuts = data.draw(st.lists(st.integers(0, len(ids))), label="id cuts")
    frames = [list(piece) for piece in split_by(ids, id_cuts)]
    order = data.draw(st.permutations([True] * len(deltas) + [False] * len(frames)))
    verdict = run(decoder, deltas, frames, order)
    assert verdict == whole(decoder, text, ids)
    # The oracle: what codecai shows a client is the text exactly when the verdict agrees
    # (short of a cut character at the end, which it shows as U+FFFD).
    detokenizer = families.detokenizer(family.name)
    shown = detokenizer.render(ids)
    detokenizer.reset()
    client_sees_text = shown == text or (decoder.dummy_prefix and shown == " " + text)
    if not verdict.agreed:
        assert not client_sees_text
    elif not client_sees_text:
        assert shown.endswith("\ufffd")
        assert shown[:-1] in (text, " " + text)


def split_by(ids: Sequence[int], cuts: Sequence[int]) -> list[Sequence[int]]:
    bounds = [0, *sorted(set(cuts)), len(ids)]
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


@given(data=st.data())
def test_memory_is_what_one_side_is_ahead_by(families: Families, data: st.DataObject) -> None:
    family = families.map("smollm2")
    decoder = family.decoder
    text = data.draw(texts, label="text")
    ids = family.encode(text)
    deltas = split_at(text, data.draw(st.lists(st.integers(0, len(text))), label="text cuts"))
    frames = split_by(ids, data.draw(st.lists(st.integers(0, len(ids))), label="id cuts"))
    order = data.draw(st.permutations([True] * len(deltas) + [False] * len(frames)))
    verifier = StreamVerifier(decoder)
    texts_in, frames_in = iter(deltas), iter(frames)
    text_bytes = decoded = 0
    for is_text in order:
        if is_text:
            delta = next(texts_in)
            verifier.text(delta)
            text_bytes += len(delta.encode())
        else:
            frame = next(frames_in)
            verifier.ids(frame)
            decoded += len(pieces(decoder, frame))
        held = len(verifier._text) + len(verifier._ids)
        assert held == abs(text_bytes - decoded)
    assert verifier.flush(None).agreed
    assert (len(verifier._text), len(verifier._ids)) == (0, 0)


SPELLING_TRAPS = ["e\u0301", "\u0301", "\u212b", "\u2126", "\u0958", "\u0344", "\u2581", " \u2581 "]
spelling_texts = st.lists(
    st.one_of(
        st.sampled_from(SPELLING_TRAPS),
        st.characters(min_codepoint=0x300, max_codepoint=0x36F),
        st.text(characters, max_size=3),
    ),
    max_size=16,
).map("".join)


@pytest.mark.parametrize("name", TRAP_FAMILIES)
@given(data=st.data())
def test_retokenized_text_is_the_text_for_a_client(
    families: Families, name: str, data: st.DataObject
) -> None:
    # Whatever the text, what a client decodes from the retokenizer's IDs with the published
    # map (our decoder, and codecai's) is that text: normalization traps included.
    text = data.draw(spelling_texts, label="text")
    deltas = split_at(text, data.draw(st.lists(st.integers(0, len(text))), label="cuts"))
    assert retokenized(families, name, deltas) == Verification(True, None, len(text.encode()))
    retokenizer = Retokenizer(families.scheme(name))
    ids = [i for delta in deltas for i in retokenizer.feed(delta)] + retokenizer.flush()
    decoder = families.map(name).decoder
    shown = pieces(decoder, ids)
    assert shown == text.encode() or (decoder.dummy_prefix and shown == b" " + text.encode())
    detokenizer = families.detokenizer(name)
    rendered = detokenizer.render(ids)
    detokenizer.reset()
    assert rendered == text or (decoder.dummy_prefix and rendered == " " + text)


# --- the backend-ID check and the verifier agree ----------------------------------------------


def served(
    vocabulary: Vocabulary, decoder: MapDecoder, events: Sequence[bytes]
) -> tuple[list[int], str, Verification]:
    """A backend-ID stream as the proxy serves it, verified: the IDs sent, the text streamed and
    the verdict."""
    heard: list[str] = []
    verifier = StreamVerifier(decoder)

    def text(delta: str) -> None:
        heard.append(delta)
        verifier.text(delta)

    transcoder = CodecTranscoder(
        vocabulary.scheme,
        parse_completion_chunk,
        token_ids="backend",
        token_bytes=vocabulary.token_bytes,
        on_text=text,
    )
    frames = [frame for event in events for frame in transcoder.feed(event)]
    frames += transcoder.flush()
    sent = [i for frame in frames for i in frame.ids]
    for frame in frames:
        verifier.ids(frame.ids)
    return sent, "".join(heard), verifier.flush(frames[-1].finish_reason)


@pytest.mark.parametrize(
    "capture",
    [
        "llamacpp-completions-stop-logprobs.txt",  # the stop string's ID with text ""
        "llamacpp-completions-stop-holdback-logprobs.txt",  # " Paris" held for a stop string
        "llamacpp-completions-eos-logprobs.txt",  # <|im_end|> with text ""
        "llamacpp-completions-cut-utf8-logprobs.txt",
        "llamacpp-completions-emoji-logprobs.txt",
    ],
)
def test_recorded_backend_id_streams_verify(
    smollm2_vocabulary: Vocabulary, smollm2: MapDecoder, families: Families, capture: str
) -> None:
    sent, text, verdict = served(smollm2_vocabulary, smollm2, load_capture(capture).events)
    assert verdict == Verification(True, None, len(text.encode()))
    detokenizer = families.detokenizer("smollm2")
    assert detokenizer.render(sent) == text  # what a client reads is the JSON answer
    detokenizer.reset()


def completion_event(text: str, ids: Sequence[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": {"content": [{"id": i} for i in ids]}}
    return b"data: " + json.dumps({"choices": [{**choice, "finish_reason": finish}]}).encode()


@given(text=texts, stop=texts.filter(bool), cuts=st.lists(st.integers(0, 40)))
def test_a_stop_string_reported_with_no_text_verifies(
    smollm2_vocabulary: Vocabulary, smollm2: MapDecoder, text: str, stop: str, cuts: list[int]
) -> None:
    # llama.cpp's shape for a matched stop string: its IDs in a chunk with text "", then the
    # finish. OpenAI's `stop` leaves it out of the answer: the client reads the text alone.
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    events = [
        completion_event(delta, tokenizer.encode(delta, add_special_tokens=False).ids) + b"\n\n"
        for delta in split_at(text, cuts)
        if delta
    ]
    stop_ids = tokenizer.encode(stop, add_special_tokens=False).ids
    events += [completion_event("", stop_ids) + b"\n\n", completion_event("", [], "stop") + b"\n\n"]
    sent, streamed, verdict = served(smollm2_vocabulary, smollm2, events)
    assert streamed == text
    assert verdict.agreed
    assert b"".join(smollm2.table[i] or b"" for i in sent) == text.encode()


# --- the rules, on SmolLM2's real vocabulary (byte-level) ------------------------------------

HELLO, WORLD, WORD, AGAIN, IM_END = 19556, 905, 2229, 1163, 2  # "Hello", " world", ...


@pytest.fixture(scope="module")
def smollm2(families: Families) -> MapDecoder:
    return families.map("smollm2").decoder


def byte_token(decoder: MapDecoder, value: int) -> int:
    return decoder.table.index(bytes([value]))


def test_agreement_counts_the_text(smollm2: MapDecoder) -> None:
    assert run(smollm2, ["Hello", " world"], [[HELLO], [WORLD]]) == Verification(True, None, 11)
    assert run(smollm2, [], []) == AGREED_WHOLE


@pytest.mark.parametrize(
    ("ids", "at"),
    [
        ([HELLO, WORD], 9),  # " wor|ld" against " wor|d"
        ([WORLD], 0),  # "Hello" dropped
        ([HELLO], 5),  # " world" dropped: the text goes on where the IDs stop
        ([HELLO, WORLD, AGAIN], 11),  # one too many: past the end of the text
        ([HELLO, HELLO, WORLD], 5),
        ([HELLO, 1 << 20, WORLD], 5),  # unknown to the map: U+FFFD where the text has more
        ([HELLO, -1, WORLD], 5),
        ([HELLO, WORLD, 1 << 20], 11),
    ],
)
def test_one_wrong_id_is_a_mismatch_at_its_byte(
    smollm2: MapDecoder, ids: list[int], at: int
) -> None:
    mismatch = Verification(False, at, at)
    for frames in ([ids], [[i] for i in ids]):
        assert run(smollm2, ["Hello world"], frames) == mismatch  # the text first
        assert run(smollm2, ["Hello world"], frames, [False] * len(frames) + [True]) == mismatch
        assert run(smollm2, ["Hel", "lo wo", "rld"], frames, [True, False] * 3) == mismatch


def test_special_tokens_render_as_nothing(smollm2: MapDecoder) -> None:
    ids = [IM_END, HELLO, IM_END, WORLD, IM_END]
    assert run(smollm2, ["Hello world"], [ids]) == Verification(True, None, 11)
    assert run(smollm2, ["Hello world"], [[i] for i in ids], [False] * 5 + [True]).agreed


def test_a_special_token_inside_a_character_breaks_it(smollm2: MapDecoder) -> None:
    # codecai renders the bytes before it as U+FFFD: no text may continue the character.
    party = [byte_token(smollm2, b) for b in "🎉".encode()]
    split = [*party[:2], IM_END, *party[2:]]
    assert run(smollm2, ["🎉"], [party]).agreed
    for order in ([True, False], [False, True]):
        assert run(smollm2, ["🎉"], [split], order) == Verification(False, 2, 2)
    assert run(smollm2, ["a🎉"], [[smollm2.table.index(b"a"), *split]]).first_difference == 3
    # At the end, with nothing after it, the cut character still stands (see below).
    a = smollm2.table.index(b"a")
    assert run(smollm2, ["a"], [[a, *party[:2], IM_END]]).agreed
    assert not run(smollm2, ["a"], [[a, *party[:2], IM_END, *party[2:]]]).agreed


def test_a_character_cut_at_the_end(smollm2: MapDecoder) -> None:
    # max_tokens cut "🎉" after 1, 2 or 3 of its 4 bytes: llama.cpp never streams them.
    party = [byte_token(smollm2, b) for b in "🎉".encode()]
    comma = smollm2.table.index("、".encode())  # one token, three bytes
    for count in (1, 2, 3):
        for frames in ([[comma, *party[:count]]], [[comma], party[:count]]):
            assert run(smollm2, ["、"], frames, finish="length") == Verification(True, None, 3)
    # Only the first bytes of one character: all of it, a second one, or a stray byte differ.
    for extra in (party, [party[0], party[0]], party[1:2], [*party, party[0]]):
        assert run(smollm2, ["、"], [[comma, *extra]], finish="length") == Verification(False, 3, 3)


def test_a_tool_call_turn_leaves_its_region_uncompared(smollm2: MapDecoder) -> None:
    # The backend streams the markup as calls, not text; its IDs stay in `ids` (codec-spec §2.5).
    ids = [HELLO, WORLD, AGAIN, IM_END]
    assert run(smollm2, ["Hello world"], [ids], finish="tool_call") == Verification(True, None, 11)
    assert not run(smollm2, ["Hello world"], [ids], finish="eos_token").agreed
    assert not run(smollm2, ["Hello world"], [[HELLO, 1 << 20]], finish="tool_call").agreed


def test_byte_level_maps_have_no_dummy_prefix(smollm2: MapDecoder) -> None:
    assert run(smollm2, ["world"], [[WORLD]]) == Verification(False, 0, 0)


def test_the_verdict_holds_no_text_and_is_final(smollm2: MapDecoder) -> None:
    assert [(f.name, f.type) for f in dataclasses.fields(Verification)] == [
        ("agreed", "bool"),
        ("first_difference", "int | None"),
        ("compared_bytes", "int"),
    ]
    verifier = StreamVerifier(smollm2)
    verifier.text("Hello world")
    verifier.ids([HELLO, WORD])
    # A difference stops the work and frees what was held; later input changes nothing.
    assert (len(verifier._text), len(verifier._ids)) == (0, 0)
    verifier.text("more")
    verifier.ids([WORLD])
    first = verifier.flush("eos_token")
    assert first == Verification(False, 9, 9)
    assert verifier.flush(None) is first
    # An agreed stream is as final: nothing is held after its end.
    agreed = StreamVerifier(smollm2)
    agreed.ids([HELLO])
    agreed.text("Hello")
    verdict = agreed.flush("length")
    agreed.text("more")
    agreed.ids([WORLD])
    assert (len(agreed._text), len(agreed._ids)) == (0, 0)
    assert agreed.flush(None) is verdict == Verification(True, None, 5)


# --- SentencePiece's dummy prefix (Mistral's metaspace map) ----------------------------------


@pytest.fixture(scope="module")
def mistral(families: Families) -> MapFamily:
    return families.map("mistral.json")


def ids_of(family: MapFamily, *tokens: str) -> list[int]:
    vocab = family.loaded.tokenizer.get_vocab()
    return [vocab[token] for token in tokens]


@pytest.mark.parametrize(
    ("text", "tokens", "verdict"),
    [
        ("Hello", ("▁Hello",), Verification(True, None, 5)),  # retokenized: "▁" prepended
        (" Hello", ("▁", "▁Hello"), Verification(True, None, 6)),
        (" Hello", ("▁Hello",), Verification(True, None, 6)),  # backend IDs, no prefix
        ("  two", ("▁▁", "▁two"), Verification(True, None, 5)),
        ("  two", ("▁", "▁two"), Verification(True, None, 5)),
        (" two", ("▁", "▁", "▁two"), Verification(False, 1, 1)),
        ("Hello", ("▁▁", "Hello"), Verification(False, 0, 0)),  # one space only
        ("Hello", ("Hello",), Verification(True, None, 5)),
        ("", ("▁",), Verification(True, None, 0)),
        (" ", ("▁▁",), Verification(True, None, 1)),
        (" ", ("▁", "▁▁"), Verification(False, 1, 1)),
    ],
)
def test_the_sentencepiece_prefix(
    mistral: MapFamily, text: str, tokens: tuple[str, ...], verdict: Verification
) -> None:
    ids = ids_of(mistral, *tokens)
    assert whole(mistral.decoder, text, ids) == verdict
    for frames in ([ids], [[i] for i in ids]):
        for deltas in ([text], list(text)):
            orders = set(itertools.permutations([True] * len(deltas) + [False] * len(frames)))
            for order in sorted(orders):
                assert run(mistral.decoder, deltas, frames, order) == verdict, (deltas, order)


def test_an_unknown_id_before_the_prefix_is_settled(mistral: MapFamily) -> None:
    decoder = mistral.decoder
    (space,) = ids_of(mistral, "▁")
    # " " then U+FFFD against " x": as many leading spaces, so no prefix; they differ after it.
    assert run(decoder, [" x"], [[space, 1 << 20]], [False, True]) == Verification(False, 1, 1)
    assert run(decoder, [" "], [[space, space, 1 << 20]], [False, True]).first_difference == 1
