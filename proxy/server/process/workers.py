"""`--workers N`: N worker processes listening on one port (SO_REUSEPORT), one supervisor.

The kernel spreads connections across the workers, so a machine's cores are all used. The
supervisor forwards SIGTERM/SIGINT (each worker then drains on its own) and SIGHUP (each worker
reloads on its own), restarts a worker that dies unexpectedly, and gives the workers a shared
directory for Prometheus samples so that `/metrics` on any worker reports the whole machine.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

from proxy import hangups
from proxy.settings import Settings

log = logging.getLogger("codec_proxy")

# (index, reload at start): a worker restarted after a reload was started with the settings of
# the process start, and catches up by reloading as soon as it serves.
WorkerMain = Callable[[int, bool], None]
# A worker that keeps dying is restarted at most this often.
_RESTART_BACKOFF = 1.0


def supervise(settings: Settings, worker_main: WorkerMain) -> int:
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="codec-proxy-metrics-") as metrics_dir:
        # Inherited by the spawned workers before they import prometheus_client.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        workers: dict[int, BaseProcess] = {}
        stopping = False
        reloaded = False
        hangups_seen = 0

        def start(index: int) -> None:
            # Blocked here, SIGHUP is also blocked in the new worker until it has a handler
            # (the mask survives exec): one forwarded early waits instead of ending it.
            with hangups.blocked():
                seen = hangups_seen
                process = context.Process(
                    target=worker_main, args=(index, reloaded), name=f"codec-proxy-worker-{index}"
                )
                process.start()
                workers[index] = process
                if hangups_seen != seen and process.pid is not None:
                    os.kill(process.pid, signal.SIGHUP)  # one it missed while starting

        def on_signal(signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True
            for process in workers.values():
                if process.pid is not None and process.is_alive():
                    os.kill(process.pid, signal.SIGTERM)

        def on_hangup(_signum: int, _frame: object) -> None:
            nonlocal reloaded, hangups_seen
            reloaded = True
            hangups_seen += 1
            for process in list(workers.values()):
                if process.pid is not None and process.is_alive():
                    os.kill(process.pid, signal.SIGHUP)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, on_hangup)
        reloaded = hangups.take() or reloaded  # one before this handler: the file has changed
        for index in range(settings.workers):
            start(index)
        last_restart = 0.0
        while workers:
            time.sleep(0.2)
            for index, process in list(workers.items()):
                if process.is_alive():
                    continue
                process.join()
                _forget_samples(process.pid)
                del workers[index]
                if stopping:
                    continue
                log.error("worker %d exited with %s; restarting it", index, process.exitcode)
                time.sleep(max(0.0, last_restart + _RESTART_BACKOFF - time.monotonic()))
                last_restart = time.monotonic()
                start(index)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nothing left to forward it to
    return 0


def _forget_samples(pid: int | None) -> None:
    if pid is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)
