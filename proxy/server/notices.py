"""Log-once bookkeeping for per-client notices (unparsable or below-floor Codec versions)."""

from __future__ import annotations

from collections import OrderedDict

# Client addresses remembered for "log once"; the oldest are forgotten beyond this, so a scan
# from many addresses costs bounded memory (and at worst repeats a log line).
_REMEMBERED_ADDRESSES = 4096


class VersionNotices:
    """Remembers which client addresses were already logged about, per kind of notice."""

    def __init__(self, capacity: int = _REMEMBERED_ADDRESSES) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def first_time(self, kind: str, address: str) -> bool:
        key = (kind, address)
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True
