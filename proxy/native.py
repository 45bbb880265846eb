"""Which path serves the steady reads, decided once: the native step, or Python only.

The native steady path (proxy/core/steady) is built by `pip install -e .`. When it is wanted
(`CODEC_PROXY_NO_EXTENSIONS` unset) it must be there and built from the source beside it (the
source's sha256 is compiled in): a missing or stale build stops the proxy at import with what
to do, never a silent fall-back to the slower path. An installed wheel carries the build and
not the source, and is not checked against it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

from proxy.core.steady import ENV_SWITCH, NATIVE, disabled

SOURCE: Final = Path(__file__).resolve().parent / "core" / "steady" / "_steady.c"
NATIVE_PATH: Final = "native"
PYTHON_PATH: Final = "python"


class NativeBuildError(ImportError):
    """The native path was wanted but its build is missing or older than its source."""


def checked() -> str:
    """`native` or `python`; NativeBuildError when the build is missing or stale."""
    if disabled():
        return PYTHON_PATH
    way_out = (
        f"rebuild it with `pip install -e .` (gcc and the Python headers), or set "
        f"{ENV_SWITCH}=1 to run the Python path only"
    )
    if NATIVE is None:
        raise NativeBuildError(f"the native steady path is not built: {way_out}")
    if SOURCE.exists():
        digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
        if digest != NATIVE.SOURCE_HASH:
            raise NativeBuildError(
                f"the native steady path was built from another {SOURCE.name}: {way_out}"
            )
    return NATIVE_PATH


# What serves the steady reads: in the start-up lines and `codec_proxy_data_path`.
DATA_PATH: Final = checked()
