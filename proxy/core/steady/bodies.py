"""Which response bodies the C step serves, and the Python objects its counters fold into.

The step (`_steady.c`) is armed for one body when that body is plainly steady, and from then
on takes whole upstream reads: `NativeRelay` for pass-through, `NativeCodec` for a Codec body
(no verification, no safety policy). Backend IDs checked against the text are framed and
written by the step, or, for a compressed body, handed as IDs to its writer, which keeps its
flush schedule; for a retokenized stream the step hands the read's text to the retokenizer.
What the step counts while it serves (tokens, text bytes, the msgpack-delta base, the bytes and
gaps of its writes) is *folded* into the Python objects before any of them is used again:
before a declined read is fed to the body, and before the body is flushed or failed. After a
Python feed, `arm` checks the objects are back in a steady state before the step takes the
next read.

This module reads and writes the state of the objects whose steady reads the step takes over
(the transcoder, its SSE decoder and ID source, the guard, the writer's encoder); the
differential fuzz (tests/server/test_native_differential.py) holds the two paths to the same
client bytes, outcome and counters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from proxy.core.bodies import CodecBody, RelayedBody, ResponseBody
from proxy.core.guard import StreamGuard
from proxy.core.steady import NATIVE
from proxy.core.stream.chunks import parse_chat_chunk, parse_completion_chunk
from proxy.core.stream.retokenizer import RetokenizerScheme
from proxy.core.stream.token_source import ReportedIds, RetokenizedIds
from proxy.core.stream.transcode import ChunkParser, CodecTranscoder
from proxy.core.wire.frames import (
    Frame,
    MsgpackDeltaFrameEncoder,
    MsgpackFrameEncoder,
    PrefixedMsgpackFrameEncoder,
    ProtobufFrameEncoder,
)

if TYPE_CHECKING:
    from proxy.core.steady._steady import Step, Vocab

# The frame layouts the step writes (its FMT_ values), by the encoder that writes them in Python.
_FORMATS: Final[dict[type, int]] = {
    MsgpackFrameEncoder: 0,
    MsgpackDeltaFrameEncoder: 1,
    ProtobufFrameEncoder: 2,
    PrefixedMsgpackFrameEncoder: 3,
}
_CHAT: Final[dict[ChunkParser, bool]] = {parse_completion_chunk: False, parse_chat_chunk: True}


@dataclass(frozen=True, slots=True)
class Writes:
    """What the step wrote since the last fold: body bytes (unframed), the gaps between writes
    by histogram bucket and their sum, and when it last wrote (loop time; None: never)."""

    bytes_out: int
    gap_counts: list[int]
    gap_sum: float
    last_write: float | None


class NativeBody(Protocol):
    # The step hands each steady read's IDs or text (`made` makes the bytes) instead of bytes
    # to write: known once armed.
    hands: bool

    @property
    def hopeless(self) -> bool:
        """The step can never serve this body again (its kind of work needs Python)."""

    def made(self, handed: tuple[int, ...] | str, now: float) -> bytes:
        """What the step handed for a steady read (`hands`), through the body: the bytes to
        send."""

    def arm(
        self, step: Step, last_write: float, clock: Callable[[], float], bounds: Sequence[float]
    ) -> bool:
        """Arm `step` for this body if it is steady now; whether it was."""

    def fold(self, step: Step) -> Writes: ...


class NativeRelay:
    """Pass-through: the body bytes of each read in one client chunk, as `on_data` frames them."""

    __slots__ = ()

    hopeless = False
    hands = False

    def made(self, handed: tuple[int, ...] | str, now: float) -> bytes:
        raise TypeError("a relayed body's reads are bytes")

    def arm(
        self, step: Step, last_write: float, clock: Callable[[], float], bounds: Sequence[float]
    ) -> bool:
        step.relay(last_write, clock, bounds)
        return True

    def fold(self, step: Step) -> Writes:
        _, _, _, bytes_out, counts, total, last = step.fold()
        return Writes(bytes_out, counts, total, last)


class NativeCodec:
    """A Codec body's reads whose every event is a steady chunk: one frame per read, written
    by the step; or, for a writer with a flush schedule (a compressed body), the read's IDs,
    framed, merged and compressed by that writer; or, retokenized, the read's text (`hands`)."""

    __slots__ = ("_body", "_chat", "_format", "_guard", "_transcoder", "_vocab", "hands")

    def __init__(
        self,
        body: CodecBody,
        guard: StreamGuard,
        transcoder: CodecTranscoder,
        chat: bool,
        format: int,
        vocab: Vocab,
    ) -> None:
        self._body = body
        self._guard = guard
        self._transcoder = transcoder
        self._chat = chat
        self._format = format
        self._vocab = vocab
        self.hands = not body._writer.plain

    @property
    def hopeless(self) -> bool:
        return self._guard.done

    def arm(
        self, step: Step, last_write: float, clock: Callable[[], float], bounds: Sequence[float]
    ) -> bool:
        transcoder = self._transcoder
        source = transcoder._source
        if isinstance(source, RetokenizedIds):
            retokenized, steady = True, not source._texts
        elif isinstance(source, ReportedIds):
            retokenized, steady = False, not source._out and source._ids.steady
        else:
            return False  # no output yet: the source is not decided
        if not steady or not self._steady(transcoder):
            return False
        self.hands = retokenized or not self._body._writer.plain
        encoder = self._body._writer.encoder
        base = encoder._base if isinstance(encoder, MsgpackDeltaFrameEncoder) else 0
        step.codec(
            self._vocab,
            self._format,
            self._chat,
            transcoder._sse._max_event_bytes,
            base,
            last_write,
            clock,
            bounds,
            ids_only=self.hands and not retokenized,
            text_only=retokenized,
        )
        return True

    def made(self, handed: tuple[int, ...] | str, now: float) -> bytes:
        if isinstance(handed, str):
            # The retokenizer's IDs for the read's text, as `CodecBody.feed` guards and writes
            # them (its frames may end the stream: text no token spells).
            frames = self._guard._guard(self._transcoder.feed_text(handed))
        else:
            # CodecBody.feed's steady case: the guard passes a non-terminal frame as it is.
            frames = [Frame(handed)] if handed else []
        return self._body._writer.feed(frames, now)

    def _steady(self, transcoder: CodecTranscoder) -> bool:
        # What the step assumes of each read: a stream past its first frame with nothing
        # waiting anywhere (codec-spec.md §2: first and last events are the Python path's).
        sse = transcoder._sse
        return (
            self._body._started
            and self._guard._outcome is None
            and transcoder._outcome is None
            and not transcoder._calls
            and not transcoder._pairs._high
            and not sse._at_stream_start
            and not sse._skip_lf
            and not sse._partial_line
            and not sse._event_bytes
            and not sse._data
        )

    def fold(self, step: Step) -> Writes:
        tokens, text_bytes, base, bytes_out, counts, total, last = step.fold()
        if tokens or text_bytes:
            self._transcoder._tokens += tokens
            self._guard._sent += tokens
            source = self._transcoder._source
            if isinstance(source, ReportedIds):
                source._ids._base += text_bytes
            encoder = self._body._writer.encoder
            if tokens and not self.hands and isinstance(encoder, MsgpackDeltaFrameEncoder):
                encoder._base = base  # the step encoded; when it `hands` IDs the writer did
        return Writes(bytes_out, counts, total, last)


def native_body(body: ResponseBody) -> NativeBody | None:
    """The step's binding to `body`, or None when the step can never serve this kind of body
    (or the native path is off)."""
    if NATIVE is None:
        return None
    if type(body) is RelayedBody:
        return NativeRelay()
    if type(body) is not CodecBody or body._verifier is not None:
        return None
    guard = body.guard
    transcoder = guard.source
    writer = body._writer
    if (
        type(guard) is not StreamGuard
        or guard._policed is not None
        or type(transcoder) is not CodecTranscoder
        or transcoder.on_text is not None
    ):
        return None
    chat = _CHAT.get(transcoder._parse)
    format = _FORMATS.get(type(writer.encoder))
    if chat is None or format is None:
        return None
    return NativeCodec(body, guard, transcoder, chat, format, vocab(transcoder._scheme))


def vocab(scheme: RetokenizerScheme) -> Vocab:
    """The scheme's token bytes in one C array, built once per vocabulary."""
    assert NATIVE is not None
    token_bytes = scheme.token_bytes
    built: Vocab | None = token_bytes.native  # type: ignore[assignment]
    if built is not None:
        return built
    made: Vocab = NATIVE.Vocab(token_bytes.table, unspellable_lead_bytes(scheme))
    token_bytes.native = made
    return made


def unspellable_lead_bytes(scheme: RetokenizerScheme) -> bytes:
    """By byte value: 1 where a character starting with that byte is one the vocabulary cannot
    spell (`spellable_prefix`, the one source: its pattern covers whole lead-byte ranges)."""
    mask = bytearray(256)
    for byte in range(256):
        if byte < 0x80:
            sample = chr(byte)
        elif 0xC2 <= byte <= 0xF4:
            size = 2 if byte <= 0xDF else 3 if byte <= 0xEF else 4
            second = {0xE0: 0xA0, 0xF0: 0x90}.get(byte, 0x80)
            sample = bytes((byte, second, *([0x80] * (size - 2)))).decode()
        else:
            continue  # continuation bytes, and bytes UTF-8 never has
        mask[byte] = scheme.spellable_prefix(sample) == 0
    return bytes(mask)
