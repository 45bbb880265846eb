"""A loaded tokenizer's map as the proxy serves it: the id to publish it under, and its bytes."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.core.map_content import map_content
from proxy.core.map_ids import checked_map_id, derive_map_id
from proxy.core.tokenizer_map import MapContent, PublishedMap, ZstdDictionary, render_map
from proxy.tokenizers import LoadedTokenizer


def content_of(loaded: LoadedTokenizer) -> MapContent:
    """The map fields of `loaded`, `published_at` from its source (file time or the map's own)."""
    return map_content(
        loaded.tokenizer,
        encoder=loaded.encoder,
        vocab_size=loaded.vocab_size,
        special_tokens=loaded.special_tokens,
        published_at=loaded.published_at,
    )


def default_map_id(loaded: LoadedTokenizer) -> str:
    """A map's own id, else one derived from the file name (a tokenizer.json's directory)."""
    if loaded.map_id is not None:
        return loaded.map_id
    source = loaded.source
    name = source.parent.name if source.name == "tokenizer.json" else source.stem
    return derive_map_id(name)


def publish(
    loaded: LoadedTokenizer,
    map_id: str | None,
    dictionaries: Sequence[ZstdDictionary] = (),
    *,
    content: MapContent | None = None,
) -> PublishedMap:
    """The map of `loaded` under `map_id` (or its default), rendered once."""
    chosen = checked_map_id(map_id if map_id is not None else default_map_id(loaded))
    return render_map(chosen, content if content is not None else content_of(loaded), dictionaries)
