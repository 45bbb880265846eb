"""Token-ID prompts (Path A `prompt`, Path B `prompt_ids`): how many, and checked in slices.

A prompt can hold millions of IDs. Checking them one by one in Python cost seconds, during which
the event loop answered nothing, not even `/livez`. Here each check runs in C over a slice of
`SLICE` items (`set(map(type, ...))`, `min`, `max`), and the number of IDs is refused before
any of them is looked at when it is over `max_ids` (413 `prompt_too_long`). The edge runs large
bodies through these in a worker thread, and the slices are where that thread hands the
interpreter back to the loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from proxy.core.errors import PayloadTooLarge

# Items per C call: a fraction of a millisecond of work, so the loop waits about that long for
# the interpreter while a worker thread checks a long prompt.
SLICE: Final = 1 << 14


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """What a token-ID prompt must fit: IDs in [0, vocab_size), at most max_ids of them."""

    vocab_size: int
    max_ids: int

    def check_count(self, count: int, what: str = "prompt") -> None:
        """413 `prompt_too_long` when `count` IDs are more than `max_ids`.

        413 rather than 400: the request is well formed, only larger than this server will
        process (RFC 9110 §15.5.14), as for a body over `max_body_bytes`.
        """
        if count > self.max_ids:
            raise self.too_long(f"{what} has {count} token IDs")

    def too_long(self, what: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"{what}, more than the {self.max_ids} accepted "
            "(max_prompt_ids, by default the backend's context length)",
            code="prompt_too_long",
        )


def item_types(items: Sequence[Any]) -> set[type]:
    """The exact types of the items (`bool` is not `int` here)."""
    types: set[type] = set()
    for start in range(0, len(items), SLICE):
        types.update(map(type, items[start : start + SLICE]))
    return types


def outside_vocabulary(ids: Sequence[int], vocab_size: int) -> int | None:
    """An ID outside [0, vocab_size), or None when every one is inside. `ids` are ints."""
    for start in range(0, len(ids), SLICE):
        part = ids[start : start + SLICE]
        low, high = min(part), max(part)
        if low < 0:
            return low
        if high >= vocab_size:
            return high
    return None
