"""A loaded tokenizer's map as the proxy serves it: the id to publish it under, and its bytes."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.core.maps.ids import checked_map_id, derive_map_id
from proxy.core.maps.tokenizer_map import MapContent, PublishedMap, ZstdDictionary, render_map
from proxy.tokenizers import LoadedTokenizer


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
    return render_map(
        chosen, content if content is not None else loaded.map_content(), dictionaries
    )
