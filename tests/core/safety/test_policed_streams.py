"""The policy on real SmolLM2 tokens: text deltas (JSON) and Codec frames from real SSE bytes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.guard import StreamGuard
from proxy.core.http.versioning import V0_4, ClientVersion
from proxy.core.safety.matcher import MatchOutput
from proxy.core.safety.rules import CompiledRules, Vocab
from proxy.core.safety.stream import PolicedIds, PolicedText
from proxy.core.stream.chunks import parse_completion_chunk
from proxy.core.stream.transcode import CodecTranscoder, StreamOutcome
from proxy.core.wire import finish
from proxy.core.wire.frames import Frame
from proxy.core.wire.tool_calls import ToolCall
from proxy.tokenizers.vocabulary import Vocabulary
from tests.core.safety.support import compiled
from tests.fake_upstream import load_capture

CAPTURE = load_capture("llamacpp-completions-sample.txt")
TEXT = CAPTURE.stream_text()  # ", the city of New Haven was a thriving metropolis, ..."


def vocab(vocabulary: Vocabulary) -> Vocab:
    tokenizer = vocabulary.loaded.tokenizer
    return Vocab(
        size=vocabulary.loaded.vocab_size,
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False),
    )


def police_text(rules: CompiledRules, vocabulary: Vocabulary, deltas: list[str]) -> MatchOutput:
    policed = PolicedText(rules, vocabulary.scheme, vocabulary.loaded.tokenizer)
    out = MatchOutput()
    for delta in deltas:
        out = out.then(policed.feed(delta))
    return out.then(policed.flush())


def test_banned_string_split_over_three_deltas_at_every_position(
    smollm2_vocabulary: Vocabulary,
) -> None:
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["New Haven"])
    start = TEXT.index("New Haven")
    window = range(start - 2, start + len("New Haven") + 2)
    for a, b in itertools.combinations_with_replacement(window, 2):
        out = police_text(rules, smollm2_vocabulary, [TEXT[:a], TEXT[a:b], TEXT[b:]])
        assert out.stop == "halt", (a, b)
        assert "New" not in out.text
        assert TEXT.startswith(out.text)
        # The model tokenizer's IDs of " New" and " Haven" never leave.
        assert not {1315, 27108} & set(out.ids)


def test_redacted_text_and_ids(smollm2_vocabulary: Vocabulary) -> None:
    rules = compiled(vocab(smollm2_vocabulary), redact_regexes=[(r"skyscrapers?", 16)])
    deltas = [TEXT[i : i + 3] for i in range(0, len(TEXT), 3)]
    out = police_text(rules, smollm2_vocabulary, deltas)
    assert out.stop is None
    assert out.text == TEXT.replace(" skyscrapers", "[X]")
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    placeholder = tokenizer.encode("[X]", add_special_tokens=False).ids
    before, _, after = TEXT.partition(" skyscrapers")
    assert list(out.ids) == (
        tokenizer.encode(before, add_special_tokens=False).ids
        + placeholder
        + tokenizer.encode(after, add_special_tokens=False).ids
    )


@given(st.text(st.sampled_from("ab cd,.\n'é日🎉"), max_size=50), st.lists(st.integers(0, 50)))
def test_clean_text_passes_unchanged(smollm2_vocabulary: Vocabulary, text: str, cuts: list[int]):
    rules = compiled(
        vocab(smollm2_vocabulary),
        stop_strings=["zebra"],
        redact_regexes=[(r"\d+", 8)],
        stop_ids=[[1315, 27108]],
    )
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out = police_text(rules, smollm2_vocabulary, deltas)
    tokenizer = smollm2_vocabulary.loaded.tokenizer
    assert out.stop is None
    assert out.text == text
    assert list(out.ids) == tokenizer.encode(text, add_special_tokens=False).ids


# --- Codec frames: the guard around the real transcoder ---------------------------------------


def transcode(
    vocabulary: Vocabulary,
    rules: CompiledRules | None,
    pieces: list[bytes],
    client: ClientVersion = V0_4,
) -> tuple[list[Frame], StreamGuard]:
    transcoder = CodecTranscoder(vocabulary.scheme, parse_completion_chunk)
    policed = None if rules is None else PolicedIds(rules, vocabulary.loaded.tokenizer)
    guard = StreamGuard(transcoder, client, policed)
    frames: list[Frame] = []
    for piece in pieces:
        frames += guard.feed(piece)
        if guard.done:
            break
    frames += guard.flush()
    return frames, guard


def check_one_terminal(frames: list[Frame]) -> None:
    assert [f.done for f in frames] == [False] * (len(frames) - 1) + [True]
    assert all(f.ids for f in frames[:-1])


@pytest.mark.parametrize("cut", range(0, len(CAPTURE.body), 37))
def test_banned_id_sequence_across_frames(smollm2_vocabulary: Vocabulary, cut: int) -> None:
    rules = compiled(vocab(smollm2_vocabulary), stop_ids=[[1315, 27108]])  # " New", " Haven"
    pieces = [CAPTURE.body[:cut], CAPTURE.body[cut:]]
    frames, guard = transcode(smollm2_vocabulary, rules, pieces)
    check_one_terminal(frames)
    assert frames[-1].finish_reason == finish.POLICY_VIOLATION
    assert guard.stopped == "halt"
    ids = [i for f in frames for i in f.ids]
    assert 27108 not in ids
    assert 1315 not in ids
    expected = smollm2_vocabulary.loaded.tokenizer.encode(
        TEXT[: TEXT.index(" New Haven")], add_special_tokens=False
    ).ids
    assert ids == expected[: len(ids)]


def test_one_event_per_read_and_old_clients_get_error(smollm2_vocabulary: Vocabulary) -> None:
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["Haven"])
    for client, reason in [
        (ClientVersion(0, 3), finish.ERROR),
        (ClientVersion(0, 5), "policy_violation"),
    ]:
        frames, guard = transcode(smollm2_vocabulary, rules, CAPTURE.events, client)
        check_one_terminal(frames)
        assert frames[-1].finish_reason == reason
        assert guard.outcome is not None
        assert guard.outcome.finish_reason == reason


def test_without_a_policy_the_guard_changes_nothing(smollm2_vocabulary: Vocabulary) -> None:
    plain = CodecTranscoder(smollm2_vocabulary.scheme, parse_completion_chunk)
    expected = [f for e in CAPTURE.events for f in plain.feed(e)] + plain.flush()
    frames, guard = transcode(smollm2_vocabulary, None, CAPTURE.events)
    assert frames == expected
    assert guard.stopped is None


def test_upstream_content_filter_reaches_old_clients_as_error(
    smollm2_vocabulary: Vocabulary,
) -> None:
    body = (
        b'data: {"choices":[{"text":"Hi","index":0,"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"text":"","index":0,"finish_reason":"content_filter"}]}\n\n'
    )
    for client, reason in [
        (ClientVersion(0, 2), "error"),
        (ClientVersion(0, 4), "policy_violation"),
    ]:
        frames, guard = transcode(smollm2_vocabulary, None, [body], client)
        assert frames[-1].finish_reason == reason
        assert guard.stopped is None  # the upstream's verdict; nothing to cancel


class ScriptedFrames:
    """A `FrameSource` that hands out prepared frames, one list per `feed`."""

    def __init__(self, steps: list[list[Frame]]) -> None:
        self._steps = iter(steps)
        self.outcome: StreamOutcome | None = None
        self.token_source: str | None = "backend"

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def feed(self, data: bytes) -> list[Frame]:
        frames = next(self._steps)
        if frames and frames[-1].done:
            reason = frames[-1].finish_reason or ""
            self.outcome = StreamOutcome(reason, None, 0, None, token_source="backend")
        return frames

    def flush(self) -> list[Frame]:
        return []

    def fail(self, error: str) -> list[Frame]:
        return []


def test_tool_calls_wait_for_ids_the_policy_holds_back(smollm2_vocabulary: Vocabulary) -> None:
    tokenizer = smollm2_vocabulary.loaded.tokenizer

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False).ids)

    weather, time = ToolCall("get_weather", "{}", "a"), ToolCall("get_time", "{}", "b")
    rules = compiled(vocab(smollm2_vocabulary), stop_strings=["New Haven"])
    source = ScriptedFrames(
        [
            [Frame(ids("Let me check"))],
            [Frame(ids(" New"), tool_calls=(weather,))],  # " New" may start "New Haven": held
            [Frame(ids(" York"), done=True, finish_reason="tool_call", tool_calls=(time,))],
        ]
    )
    guard = StreamGuard(source, V0_4, PolicedIds(rules, tokenizer))
    frames = [frame for _ in range(3) for frame in guard.feed(b"")]
    check_one_terminal(frames)
    assert [frame.tool_calls for frame in frames] == [(), (weather, time)]
    assert tokenizer.decode([i for f in frames for i in f.ids]) == "Let me check New York"
    assert guard.outcome is not None
    assert guard.outcome.token_source == "backend"  # the source's outcome, kept whole
