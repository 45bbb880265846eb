"""Per-response policy state: token IDs (Codec) or text deltas (JSON) in, policed output out.

Both paths match the same thing: the model tokenizer's IDs and the text they decode to. A Codec
stream already has the IDs; a JSON stream's text is retokenized first with the same
`Retokenizer`, so a given text gets the same verdict whichever format the client asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from proxy.core.safety.matcher import MatchOutput, PolicyMatcher
from proxy.core.safety.rules import CompiledRules
from proxy.core.stream.retokenizer import Retokenizer, RetokenizerScheme


class TokenTexts:
    """Each token's share of the decoded text, in order.

    The tokenizer's own streaming decoder decides: a token whose bytes complete no character
    yet gets "" and the token that completes it gets the character, so the concatenation is
    exactly `tokenizer.decode(ids)`.
    """

    __slots__ = ("_stream", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=False)

    def texts(self, ids: Sequence[int]) -> list[str]:
        step = self._stream.step
        tokenizer = self._tokenizer
        return [step(tokenizer, token) or "" for token in ids]


class PolicedIds:
    """A Codec stream's token IDs through the policy."""

    __slots__ = ("_matcher", "_texts")

    def __init__(self, rules: CompiledRules, tokenizer: Tokenizer) -> None:
        self._texts = TokenTexts(tokenizer)
        self._matcher = PolicyMatcher(rules)

    @property
    def held(self) -> int:
        return self._matcher.held

    def feed(self, ids: Sequence[int]) -> MatchOutput:
        return self._matcher.feed(ids, self._texts.texts(ids))

    def flush(self) -> MatchOutput:
        return self._matcher.flush()


class PolicedText:
    """A JSON stream's text deltas through the retokenizer, then the policy."""

    __slots__ = ("_ids", "_retokenizer")

    def __init__(self, rules: CompiledRules, scheme: RetokenizerScheme, tokenizer: Tokenizer):
        self._retokenizer = Retokenizer(scheme)
        self._ids = PolicedIds(rules, tokenizer)

    def feed(self, text: str) -> MatchOutput:
        return self._ids.feed(self._retokenizer.feed(text))

    def flush(self) -> MatchOutput:
        return self._ids.feed(self._retokenizer.flush()).then(self._ids.flush())
