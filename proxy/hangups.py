"""SIGHUP before the proxy serves: remembered, then applied once it does.

SIGHUP's default action ends a process. A `codec-proxy reload` can come while a process is
still importing, reading its configuration or loading its tokenizers (its pid file is written
first, so that it can be found), or while the supervisor of `--workers N` is starting a worker.
Such a signal must neither end the process nor be lost: it is held from the first line of the
command (proxy/__main__.py), and the reload runs as soon as the process serves
(proxy/server/process/runner.py).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_pending = False


def remember() -> None:
    """A reload is owed once serving starts (also: a worker restarted after a reload)."""
    global _pending
    _pending = True


def defer() -> None:
    """From now until serving, a SIGHUP is remembered. Unblocks one held back by `blocked()`
    in the process that started this one (the mask survives exec)."""
    signal.signal(signal.SIGHUP, lambda _signum, _frame: remember())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


def release() -> None:
    """For a command that does not serve: SIGHUP's default action again, and one that came
    while it started takes effect now."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if take():
        signal.raise_signal(signal.SIGHUP)


def take() -> bool:
    """Whether a SIGHUP came before serving started; forgotten once asked."""
    global _pending
    pending, _pending = _pending, False
    return pending


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """SIGHUP held back here, and in any process started meanwhile until it calls `defer()`:
    a worker being spawned has no handler yet, and the default action would end it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
