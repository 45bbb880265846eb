"""The native steady path: one C call per upstream read once a stream is plainly steady.

`_steady.c` undoes a chunked upstream body's framing and, for a stream whose body it was armed
for (`bodies.py`), either re-frames the body for a pass-through client or turns its SSE events
into Codec frames, returning the bytes to write. Whatever it does not plainly handle it
*declines*, having changed nothing, and the read goes to the Python body, which stays the
reference: the differential fuzz (tests/server/test_native_differential.py) holds the two to
the same bytes.

`CODEC_PROXY_NO_EXTENSIONS=1`, at build (setup.py) and at import, leaves it out: `NATIVE` is
then None and every read takes the Python path. Whether a build that should be there is there,
and is built from this very source, is checked once by `proxy/native.py`, loudly.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Final

ENV_SWITCH: Final = "CODEC_PROXY_NO_EXTENSIONS"


def disabled() -> bool:
    """The switch is set (to anything but `0`): the Python path only."""
    return os.environ.get(ENV_SWITCH, "") not in ("", "0")


def _load() -> ModuleType | None:
    if disabled():
        return None
    try:
        from proxy.core.steady import _steady
    except ImportError:
        return None  # proxy/native.py refuses to start without it
    return _steady


NATIVE: Final = _load()
