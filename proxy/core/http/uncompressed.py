"""Which responses go uncompressed whatever the client accepts (`uncompressed`,
`uncompressed_keys`).

A compressed answer that holds a secret beside text a third party chose tells whoever can see
its length whether a guess at the secret was right (BREACH): the right guess repeats the secret,
and compresses smaller. Measured for every coding the proxy sends, JSON and Codec, whole and
streamed, in docs/COMPRESSION.md "When not to compress". Where a model's answers, or one API
key's, can mix the two, the operator leaves them uncompressed: JSON goes as it came, a Codec
stream in identity (a client that refuses identity gets the 406 of any coding it cannot have),
and a Codec upstream is asked for identity too.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.core.http.access import has_key

__all__ = ["uncompressed"]


def uncompressed(*, model: bool, key: str, keys: Sequence[str]) -> bool:
    """Whether a response goes uncompressed: its model's `uncompressed`, or the request's
    Bearer token `key` ("" without one) among `keys` (compared in constant time)."""
    return model or bool(key and keys and has_key(key, keys))
