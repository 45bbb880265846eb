"""Tokenizer map ids: which are publishable, and a safe default derived from a file name.

WELL_KNOWN_DISCOVERY.md: "IDs MUST be lowercase ASCII matching `[a-z0-9._/-]+`. Maintainers
MUST NOT publish documents whose ID contains `..`, leading `/`, or any other path traversal
sequence." codecai also refuses a trailing `/` (interop.md §1.6). We go one step further and
refuse every empty, `.` or `..` segment: URL normalization (RFC 3986 §5.2.4) would change the
meaning of such a path between the client and us, so no such id can be addressed reliably.
"""

from __future__ import annotations

import re

from proxy.core.errors import TokenizerMapError

_ID_CHARS = re.compile(r"[a-z0-9._/-]+")
_NOT_ID_CHARS = re.compile(r"[^a-z0-9._-]+")
# Content-addressed maps live at maps/sha256/<hex>.json, so no id may claim that subtree.
CONTENT_ADDRESSED_PREFIX = "sha256/"
# `maps/inline/<id>.json`: a map inline at a path that stays put while its contents change,
# beside the pointer `maps/<id>.json` serves for a large map (proxy/core/maps/discovery.py).
INLINE_PREFIX = "inline/"
FALLBACK_MAP_ID = "model"


def map_id_problem(map_id: str) -> str | None:
    """Why `map_id` cannot be published under `/.well-known/codec/maps/`, or None if it can."""
    if not _ID_CHARS.fullmatch(map_id):
        return "must be lowercase ASCII letters, digits and . _ / - only"
    segments = map_id.split("/")
    if any(segment in ("", ".", "..") for segment in segments) or ".." in map_id:
        return "must not contain '..', empty or '.' segments, or a leading or trailing '/'"
    if map_id.startswith(CONTENT_ADDRESSED_PREFIX):
        return f"must not start with {CONTENT_ADDRESSED_PREFIX!r} (the content-addressed maps)"
    if map_id.startswith(INLINE_PREFIX):
        return f"must not start with {INLINE_PREFIX!r} (the inline form of large maps)"
    return None


def checked_map_id(map_id: str) -> str:
    """`map_id` itself if publishable; TokenizerMapError naming the rule otherwise."""
    problem = map_id_problem(map_id)
    if problem is not None:
        raise TokenizerMapError(f"map id {map_id!r} {problem}")
    return map_id


def derive_map_id(name: str) -> str:
    """A publishable id from a file or directory name: `SmolLM2-135M.Q4_1` -> `smollm2-135m.q4_1`.

    Used when the operator names no id; runs of other characters become one `-`.
    """
    candidate = _NOT_ID_CHARS.sub("-", name.lower()).strip("-.")
    candidate = re.sub(r"\.{2,}", ".", candidate)
    return candidate if candidate and map_id_problem(candidate) is None else FALLBACK_MAP_ID
