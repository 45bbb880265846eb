"""Incremental retokenizer: streamed text deltas in, the model's final token IDs out.

The invariant (proved by property tests over random texts and random splits): for any way of
cutting a text into deltas, the IDs emitted by `feed()` calls followed by `flush()` are exactly
`scheme.encode_exactly(text)`: `tokenizer.encode(text, add_special_tokens=False)` wherever those
IDs render the text, so decoding them gives the text back, byte for byte.

Where they do not, the tokenizer would hand a client other text than the backend streamed:
Qwen3's NFC normalizer composes `cafe\u0301` into `café`, SentencePiece reads a literal `▁` as
a space, and a byte-level vocabulary without a token for some byte (SmolLM2 has none for 0x16
or 0xF1) drops it. There the text is *spelled*: each run of tokens that renders other bytes
than the text it came from (by the tokenizer's offsets), and any text no token came from, is
replaced by the tokens of its single bytes, which every client decodes as those bytes
(byte-level BPE has a token per byte character; SentencePiece with byte fallback `<0xNN>`,
declared in the map). Text a byte has no token for cannot be given to a client as IDs at all:
an `UpstreamProtocolError` (`untokenizable_text`), which ends the stream with an error frame.

Why this is not trivial: BPE merges never cross a pre-token, but appending text can still
change the last pre-tokens of what we have. With byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM2)
the space belongs to the *following* word, a run of whitespace is split depending on what comes
after it (`"a  "` is `a, "  "` but `"a  b"` is `a, " ", " b"`), Llama-3 glues newlines to a
preceding punctuation run, and `'` becomes part of `'re` only once `re` arrives. Cutting at
whitespace, as the reference `Translator` does, is therefore wrong (interop.md §1.7).

So each stream keeps a *window* of text that has not been turned into IDs yet. After a feed we
encode the window and commit only the pre-tokens that no later text can change:

* everything from the pre-token holding the window's last non-whitespace character onwards is
  held back (the last word may grow, and trailing whitespace may regroup);
* an apostrophe in the last two characters holds back everything from it on (`'` and `r` are
  two pre-tokens until `e` makes them one `'re`);
* text that could still become an added token (e.g. Qwen's `<think>`) is held back, and so is
  the pre-token before it: once the added token completes, the text in front of it is a
  segment of its own, whose trailing whitespace regroups as at the end of a text;
* with a normalizer, no cut goes before a combining mark or a character that composes with the
  one before it: a mark that comes later can still reorder with it and compose with the
  letter in front (UAX #15; `U` + U+0305, then U+031B, is `Ư` + U+0305).

The window then restarts at the cut. Encoding starts afresh there, which is only sound because a
cut is a hard boundary: no BPE merge crosses it and the pre-tokenizer's decision before it is
final. Committed text is never encoded again, so the cost is O(total text); a window that cannot
be cut yet (a very long word) is retried only after it grew by a quarter, which keeps the
pathological case linear too.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tokenizers import Encoding, Tokenizer

from proxy.core.errors import UpstreamProtocolError
from proxy.core.stream.token_bytes import BYTE_LEVEL_CHARACTERS, TokenBytes

# The byte-level pre-tokenizers match contractions ('s, 't, 're, 've, 'm, 'll, 'd) before
# anything else. One that is still incomplete starts with an apostrophe in the last two
# characters; nothing from that apostrophe on is final yet.
CONTRACTION_TAIL = 2

_METASPACE = "\u2581"

# After a failed cut attempt, wait until the window has grown by this fraction.
RETRY_GROWTH = 4  # i.e. by len // 4, and by at least one character

Encoder = Literal["byte_level", "metaspace"]


def _without_post_processor(config: dict[str, Any]) -> dict[str, Any]:
    # The post-processor adds BOS/EOS and trims offsets; we want raw, untrimmed pre-token
    # offsets and never special tokens of our own.
    return {**config, "post_processor": None}


def _without_prefix_space(config: dict[str, Any]) -> dict[str, Any]:
    """The same tokenizer, minus what it adds at the very start of a text.

    SentencePiece-style tokenizers prepend "▁" to the whole input (a `Prepend` normalizer or
    `Metaspace(prepend_scheme=...)`); byte-level ones may `add_prefix_space`. A window that
    continues a stream is not the start of the text, so it must not get that prefix.
    """

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            kind = node.get("type")
            if kind == "Sequence":
                key = "normalizers" if "normalizers" in node else "pretokenizers"
                kept = [strip(child) for child in node.get(key, []) if not _is_prepend(child)]
                return {**node, key: kept}
            if kind == "Metaspace":
                return {**node, "prepend_scheme": "never", "add_prefix_space": False}
            if kind == "ByteLevel":
                return {**node, "add_prefix_space": False}
        return node

    normalizer = config.get("normalizer")
    if _is_prepend(normalizer):
        normalizer = None
    return {
        **config,
        "normalizer": strip(normalizer),
        "pre_tokenizer": strip(config.get("pre_tokenizer")),
    }


def _is_prepend(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") == "Prepend"


def _build(config: dict[str, Any]) -> Tokenizer:
    tokenizer = Tokenizer.from_str(json.dumps(config))
    # Special-token strings inside generated text are text, as llama.cpp treats them with
    # parse_special=false and vLLM when detokenized output is re-read.
    tokenizer.encode_special_tokens = True
    return tokenizer


@dataclass(frozen=True)
class RetokenizerScheme:
    """Everything about one tokenizer that streams share; built once at start-up."""

    first: Tokenizer  # encodes a window that starts the text
    rest: Tokenizer  # encodes a window that continues the text
    encoder: Encoder
    # Every proper prefix of an added token that is matched inside text (non-special added
    # tokens, e.g. Qwen's "<think>"), so a partial one at the window's end is held back.
    added_prefixes: frozenset[str]
    longest_added_prefix: int
    # Each ID's bytes as a client renders them; by byte value, the ID that renders that one
    # byte (None: the vocabulary has none a client decodes so).
    token_bytes: TokenBytes
    byte_ids: tuple[int | None, ...]
    # What `first` renders at the start of a text beyond the text: SentencePiece's "▁", a space
    # that clients drop again (proxy/core/verify/verifier.py, the prefix rule).
    prefix: bytes
    # A text with none of these characters (and, with `nfc`, in NFC) renders as itself, so its
    # IDs need no check; None: always check (a normalizer we do not know the effect of).
    unsure: re.Pattern[str] | None
    nfc: bool
    # Characters no IDs of this vocabulary render (a byte of theirs has no token); None: none,
    # or too many to list (then `encode_exactly` still refuses them).
    unspellable: re.Pattern[str] | None
    # With a normalizer: the characters that text after them can still reorder or compose with
    # what comes before them (UAX #15: not a stable starter); no cut goes before one.
    joins_backward: frozenset[str]

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, encoder: Encoder) -> RetokenizerScheme:
        config = _without_post_processor(json.loads(tokenizer.to_str()))
        if encoder == "metaspace":
            _check_spaces_are_hard_boundaries(config)
        prefixes = {
            token.content[:i]
            for token in tokenizer.get_added_tokens_decoder().values()
            if not token.special
            for i in range(1, len(token.content))
        }
        continuing = _without_prefix_space(config)
        first, rest = _build(config), _build(continuing)
        token_bytes = TokenBytes.from_tokenizer(tokenizer, encoder)
        byte_ids = _byte_ids(tokenizer, config, encoder, token_bytes)
        probe = "x"
        at_start = token_bytes.joined(first.encode(probe, add_special_tokens=False).ids)
        missing = _characters_needing(i for i, token in enumerate(byte_ids) if token is None)
        # An added token that takes the whitespace around it renders less than its match.
        stripping = any(
            token.lstrip or token.rstrip
            for token in tokenizer.get_added_tokens_decoder().values()
            if not token.special
        )
        unsure, nfc = (
            (None, False)
            if stripping
            else _quick_check(continuing.get("normalizer"), encoder, missing)
        )
        return cls(
            first=first,
            rest=rest,
            encoder=encoder,
            added_prefixes=frozenset(prefixes),
            longest_added_prefix=max(map(len, prefixes), default=0),
            token_bytes=token_bytes,
            byte_ids=byte_ids,
            prefix=at_start.removesuffix(probe.encode()),
            unsure=unsure,
            nfc=nfc,
            unspellable=re.compile(f"[{missing}]") if missing else None,
            joins_backward=_joins_backward() if config.get("normalizer") else frozenset(),
        )

    def encode(self, text: str, *, at_start: bool) -> list[int]:
        """Encode a piece of text as the backend would, at the start of a text or not."""
        tokenizer = self.first if at_start else self.rest
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def spellable_prefix(self, text: str) -> int:
        """How many characters of `text` come before the first one no IDs can render."""
        found = self.unspellable.search(text) if self.unspellable is not None else None
        return len(text) if found is None else found.start()

    def encode_exactly(self, text: str, *, at_start: bool) -> list[int]:
        """IDs that render exactly `text`: `encode`'s, spelled in bytes where they would not
        (the module docstring). UpstreamProtocolError where no IDs can."""
        encoding = (self.first if at_start else self.rest).encode(text, add_special_tokens=False)
        return self.exactly(encoding, len(encoding.ids), text, at_start=at_start)

    def exactly(self, encoding: Encoding, count: int, text: str, *, at_start: bool) -> list[int]:
        """The first `count` IDs of `encoding`, which come from `text` (a prefix of what was
        encoded), made to render exactly `text`."""
        ids: list[int] = encoding.ids[:count]
        unsure = self.unsure
        if (
            unsure is not None
            and unsure.search(text) is None
            and (not self.nfc or unicodedata.is_normalized("NFC", text))
        ):
            return ids
        prefix = self.prefix if at_start and text else b""
        if self.token_bytes.joined(ids) == prefix + text.encode():
            return ids
        return self._spelled(ids, encoding.offsets, text, prefix)

    def _spelled(
        self, ids: list[int], offsets: Sequence[tuple[int, int]], text: str, prefix: bytes
    ) -> list[int]:
        # Runs of tokens whose offsets overlap stand for one span of `text` together (a
        # character's byte tokens, a normalized character); each run is kept if it renders its
        # span, else spelled. Text between runs was dropped by the tokenizer: spelled too.
        out: list[int] = []
        done = 0  # characters of `text` accounted for
        index = 0
        while index < len(ids):
            start, end = offsets[index]
            last = index + 1
            while last < len(ids) and offsets[last][0] < end:
                end = max(end, offsets[last][1])
                last += 1
            if start > done:
                out += self._bytes(prefix + text[done:start].encode())
                prefix = b""
            run = ids[index:last]
            want = prefix + text[start:end].encode()
            out += run if self.token_bytes.joined(run) == want else self._bytes(want)
            prefix = b""
            done = max(done, end)
            index = last
        if done < len(text) or prefix:
            out += self._bytes(prefix + text[done:].encode())
        return out

    def _bytes(self, data: bytes) -> list[int]:
        out: list[int] = []
        for byte in data:
            token_id = self.byte_ids[byte]
            if token_id is None:
                raise UpstreamProtocolError(
                    f"the upstream's text has a character the model's vocabulary cannot spell "
                    f"(no token for the byte 0x{byte:02X})",
                    code="untokenizable_text",
                )
            out.append(token_id)
        return out


def _quick_check(
    normalizer: Any, encoder: Encoder, missing: str | None
) -> tuple[re.Pattern[str] | None, bool]:
    """What makes a text's IDs worth checking, for the two shapes whose effect is known;
    `missing`: the characters needing a byte no token renders (`_characters_needing`)."""
    steps = normalizer.get("normalizers", []) if _is_type(normalizer, "Sequence") else [normalizer]
    kinds = [step.get("type") for step in steps if step is not None]
    if encoder == "byte_level" and kinds in ([], ["NFC"]) and missing is not None:
        # Byte-level BPE renders every byte it has a token for: only characters whose UTF-8
        # needs another byte can come out otherwise.
        return re.compile(f"[{missing}]" if missing else "(?!)"), kinds == ["NFC"]
    sentencepiece = [{"type": "Replace", "pattern": {"String": " "}, "content": _METASPACE}]
    if encoder == "metaspace" and steps == sentencepiece and missing == "":
        # Spaces become "▁" and back; a literal "▁" comes back as a space. Byte fallback
        # covers every other character.
        return re.compile(_METASPACE), False
    return None, False


@functools.cache
def _joins_backward() -> frozenset[str]:
    """Non-starters, and starters that compose with the character before them (NFC_QC Maybe):
    the second character of every primary composite, and Hangul's medial and final jamo."""
    found = {chr(code) for code in (*range(0x1161, 0x1176), *range(0x11A8, 0x11C3))}
    for code in range(0x110000):
        char = chr(code)
        if unicodedata.combining(char):
            found.add(char)
            continue
        parts = unicodedata.decomposition(char).split()
        # A canonical pair that NFC composes back (not excluded from composition).
        if (
            len(parts) == 2
            and not parts[0].startswith("<")
            and unicodedata.normalize("NFC", char) == char
        ):
            found.add(chr(int(parts[1], 16)))
    return frozenset(found)


def _is_type(node: Any, kind: str) -> bool:
    return isinstance(node, dict) and node.get("type") == kind


def _characters_needing(missing: Iterable[int]) -> str | None:
    """A regex character class body of the characters whose UTF-8 has one of these bytes;
    None if one is a continuation byte (too many characters to list)."""
    parts = []
    for byte in missing:
        if byte < 0x80:
            parts.append(re.escape(chr(byte)))
        elif byte <= 0xBF:
            return None
        elif 0xC2 <= byte <= 0xF4:
            # A lead byte: the characters it starts, one contiguous range.
            if byte <= 0xDF:
                low, size, least = (byte & 0x1F) << 6, 1 << 6, 0x80
            elif byte <= 0xEF:
                low, size, least = (byte & 0x0F) << 12, 1 << 12, 0x800
            else:
                low, size, least = (byte & 0x07) << 18, 1 << 18, 0x10000
            parts.append(f"\\U{max(low, least):08x}-\\U{low + size - 1:08x}")
        # 0xC0, 0xC1 and 0xF5..0xFF never occur in UTF-8.
    return "".join(parts)


def _byte_ids(
    tokenizer: Tokenizer, config: dict[str, Any], encoder: Encoder, token_bytes: TokenBytes
) -> tuple[int | None, ...]:
    # Byte-level: the alphabet character of each byte is a token. SentencePiece: `<0xNN>`, but
    # only with byte fallback, the one case the map declares them bytes (core/maps/content.py).
    if encoder == "byte_level":
        pieces = list(BYTE_LEVEL_CHARACTERS)
    elif config.get("model", {}).get("byte_fallback"):
        pieces = [f"<0x{byte:02X}>" for byte in range(256)]
    else:
        return (None,) * 256
    out: list[int | None] = []
    for byte, piece in enumerate(pieces):
        token_id = tokenizer.token_to_id(piece)
        rendered = token_bytes.render([token_id]) if token_id is not None else None
        out.append(token_id if rendered == [bytes((byte,))] else None)
    return tuple(out)


def _check_spaces_are_hard_boundaries(config: dict[str, Any]) -> None:
    # For SentencePiece-style vocabularies we cut before a space that follows a non-space.
    # That is only sound if no token contains "▁" after another character, i.e. no merge can
    # span the cut. True for Llama-2/Mistral vocabularies; refuse anything else loudly.
    vocab = config.get("model", {}).get("vocab", {})
    tokens = vocab.keys() if isinstance(vocab, dict) else (entry[0] for entry in vocab)
    for token in tokens:
        body = token.lstrip("▁")
        if "▁" in body:
            raise ValueError(
                f"metaspace vocabulary has token {token!r} with an inner '▁': "
                "space boundaries are not safe cut points for this tokenizer"
            )


class Retokenizer:
    """Turns one stream's text deltas into final token IDs. One instance per response."""

    __slots__ = ("_at_start", "_next_attempt", "_scheme", "_window")

    def __init__(self, scheme: RetokenizerScheme, *, at_start: bool = True) -> None:
        # `at_start=False` continues a text that other means have tokenized so far (a span of
        # backend IDs before it): no start-of-text prefix space (see _without_prefix_space).
        self._scheme = scheme
        self._window = ""
        self._at_start = at_start
        self._next_attempt = 0

    def feed(self, text: str) -> list[int]:
        """Add a text delta; return the IDs that became final (possibly none)."""
        if not text:
            return []
        self._window += text
        if len(self._window) < self._next_attempt:
            return []
        return self._commit()

    def flush(self) -> list[int]:
        """End of the text: return the IDs of everything still held back."""
        window, self._window = self._window, ""
        if not window:
            return []
        ids = self._scheme.encode_exactly(window, at_start=self._at_start)
        self._at_start = False
        return ids

    def _commit(self) -> list[int]:
        window = self._window
        scheme = self._scheme
        encoding = (scheme.first if self._at_start else scheme.rest).encode(
            window, add_special_tokens=False
        )
        offsets = encoding.offsets
        limit = self._cut_limit(window)
        byte_level = scheme.encoder == "byte_level"
        words = encoding.word_ids if byte_level else ()
        candidates: list[tuple[int, int]] = []  # (token index, character) where a word starts
        # The furthest raw character any token so far came from. A cut is only clean if no
        # earlier token reaches past it: a normalizer can expand one raw character into text
        # of two pre-tokens (NFC turns U+0958 into U+0915 U+093C), and cutting there would
        # encode that character twice.
        reach = 0
        for index in range(1, len(offsets)):
            reach = max(reach, offsets[index - 1][1])
            start = offsets[index][0]
            if start > limit:
                break
            if start == 0 or reach > start:
                continue
            if byte_level:
                # A pre-token (a "word") starts where the word index changes.
                starts_word = words[index] != words[index - 1] or words[index] is None
            else:
                # SentencePiece: a space after a non-space starts a word; no token spans it.
                starts_word = window[start] == " " and window[start - 1] != " "
            if starts_word:
                candidates.append((index, start))
        for cut_token, cut_char in reversed(candidates):
            if self._normalizes_apart(window, cut_char):
                head = window[:cut_char]
                try:
                    ids = scheme.exactly(encoding, cut_token, head, at_start=self._at_start)
                except UpstreamProtocolError:
                    self._window = ""  # the stream ends with this error: nothing to say twice
                    raise
                self._window = window[cut_char:]
                self._at_start = False
                self._next_attempt = 0
                return ids
        self._next_attempt = len(window) + max(1, len(window) // RETRY_GROWTH)
        return []

    def _normalizes_apart(self, window: str, cut: int) -> bool:
        """Whether normalizing the two sides of a cut apart gives the whole's normalization.

        Offsets cannot always show it: NFC composes `e` + U+0344 into `ë` + U+0301, with the
        second half of one raw character in each pre-token.
        """
        scheme = self._scheme
        head = (scheme.first if self._at_start else scheme.rest).normalizer
        if head is None:
            return True
        if window[cut] in scheme.joins_backward:
            # Text still to come may reorder or compose with it and what is before the cut:
            # `A U U+0305` then U+031B becomes `A Ư U+0305`.
            return False
        tail = scheme.rest.normalizer
        rest = window[cut:]
        normalized_rest = tail.normalize_str(rest) if tail is not None else rest
        return bool(
            head.normalize_str(window) == head.normalize_str(window[:cut]) + normalized_rest
        )

    def _cut_limit(self, window: str) -> int:
        """The furthest character position a cut may be at (see the module docstring)."""
        end = len(window)
        if self._scheme.longest_added_prefix:
            # A partial added token at the end may complete; if it does, the text before it
            # becomes a segment of its own and its trailing pre-tokens regroup as at the end
            # of a text ("  </think>" is "ĠĠ", "</think>"). So treat its start as the end.
            prefixes = self._scheme.added_prefixes
            for start in range(max(0, end - self._scheme.longest_added_prefix), end):
                if window[start:] in prefixes:
                    end = start
                    break
        apostrophe = window.find("'", len(window) - CONTRACTION_TAIL)
        if apostrophe >= 0:
            end = min(end, apostrophe)
        return len(window[:end].rstrip()) - 1
