"""The pid file (`pid_file`): where `codec-proxy reload` finds the process to signal.

Written by the process that takes SIGHUP for all: the only one, or the supervisor of
`--workers N`, which forwards it to every worker.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


class PidFileError(Exception):
    """No process to signal: the message says why, in one line."""


@contextlib.contextmanager
def written(path: Path | None) -> Iterator[None]:
    """`path` holds this process's id while the block runs (None: no pid file)."""
    if path is None:
        yield
        return
    pid = os.getpid()
    # Whole or not at all: a reader never sees a half-written number.
    partial = path.with_name(f".{path.name}.{pid}")
    partial.write_text(f"{pid}\n")
    partial.replace(path)
    try:
        yield
    finally:
        # Only our own: a newer process may have taken the path over meanwhile.
        with contextlib.suppress(OSError, PidFileError):
            if read(path) == pid:
                path.unlink()


def read(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise PidFileError(f"cannot read pid file {path}: {exc.strerror or exc}") from exc
    if not text.isdigit() or int(text) <= 0:
        raise PidFileError(f"pid file {path} does not hold a process id: {text[:40]!r}")
    return int(text)
