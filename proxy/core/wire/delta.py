"""Chained zigzag deltas for `msgpack-delta` frames (spec v0.5 § v0.5-1; codec-spec.md §1.5).

A frame's `ids_delta[0]` is `zigzag(ids[0] - base_id)` and `ids_delta[k]` is
`zigzag(ids[k] - ids[k-1])`; `base_id` is the last ID of the previous frame (0 on the first).
Zigzag maps signed to unsigned so small steps either way stay one-byte msgpack fixints:
0 -> 0, -1 -> 1, 1 -> 2, -2 -> 3, ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence


def zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def unzigzag(value: int) -> int:
    return value >> 1 if value & 1 == 0 else -((value + 1) >> 1)


def encode_deltas(ids: Sequence[int], base_id: int) -> list[int]:
    deltas = []
    previous = base_id
    for token_id in ids:
        deltas.append(zigzag(token_id - previous))
        previous = token_id
    return deltas


def decode_deltas(deltas: Iterable[int], base_id: int) -> Iterator[int]:
    current = base_id
    for value in deltas:
        current += unzigzag(value)
        yield current
