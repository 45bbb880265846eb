"""Reloading the configuration of a running proxy (SIGHUP, `codec-proxy reload`).

A reload reads the configuration the way the process first read it (`CONFIG_SOURCE`: the file
again, under the environment and flags it started with), keeps only what may change at run
time (`proxy/reloading.py`), builds the whole new snapshot (`build_live`: the safety policy
compiled, the key file read) and only then swaps it in. Anything wrong, and nothing changes:
one log line names the key and the problem, and `codec_proxy_config_reloads_total{result=
"error"}` counts it. Requests already in flight keep the snapshot they started with
(proxy/server/models/live.py), so a stream never changes its flush schedule or policy halfway.

A reload that widens access (`proxy/reloading.py` `widenings`) is applied only when the
configuration states the settings it comes from, and then logged as a warning naming it: a file
cut short or emptied cannot drop keys, deny-lists or policies as if meant.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from aiohttp import web

from proxy import logs
from proxy.config import ConfigSource
from proxy.core.errors import ConfigError
from proxy.reloading import REREAD_FILES, merge, unstated, widenings
from proxy.server.models.live import LIVE, Live, build_live
from proxy.server.models.served_models import SERVED_MODELS
from proxy.server.telemetry.metrics import METRICS
from proxy.settings import Settings

log = logging.getLogger("codec_proxy")

# Called with the new snapshot once it is current (features that keep state derived from the
# settings: the continuous verification forgets its refusals).
ReloadHook = Callable[[Live], None]

CONFIG_SOURCE = web.AppKey("config_source", ConfigSource)
ON_RELOAD = web.AppKey("on_reload", list[ReloadHook])


class Reloads:
    """One reload at a time, in the order the signals came; the tasks kept until done."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[ReloadResult]] = set()


RELOADS = web.AppKey("reloads", Reloads)


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    # Runtime keys whose value changed (`models[name].key` for a model's own).
    changed: tuple[str, ...] = ()
    # Files read again whatever their path (a rotated key file, an edited policy).
    reread: tuple[str, ...] = ()
    # Restart-only keys that differ in the file, left as they were.
    needs_restart: tuple[str, ...] = ()
    # What the reload lets through that was refused before (`reloading.Widening`s).
    widened: tuple[str, ...] = ()
    # Why nothing changed, when `ok` is false: the key and the problem.
    error: str | None = None
    # The generation of the snapshot in force afterwards.
    generation: int = 0

    def describe(self) -> str:
        """The one log line."""
        if not self.ok:
            return f"config reload refused, nothing changed: {self.error}"
        parts = [f"changed {', '.join(self.changed)}" if self.changed else "no setting changed"]
        if self.reread:
            parts.append(f"re-read {', '.join(self.reread)}")
        if self.needs_restart:
            parts.append(f"needs a restart: {', '.join(self.needs_restart)} (kept as they were)")
        if self.widened:
            parts.append(f"widens access: {', '.join(self.widened)}")
        return f"config reloaded (generation {self.generation}): {'; '.join(parts)}"


def install_reloads(app: web.Application) -> None:
    """What reloading needs in `app` (the app factory calls this)."""
    app[ON_RELOAD] = []
    app[RELOADS] = Reloads()


async def reload(
    app: web.Application, new: Settings, *, stated: Collection[str] | None = None
) -> ReloadResult:
    """Apply the runtime keys of `new` to `app`, or nothing at all. `stated`: the settings the
    configuration gives (`proxy.config.Loaded`); None: `new` is meant whole."""
    async with app[RELOADS].lock:
        return await _apply(app, new, stated)


async def reload_config(app: web.Application) -> ReloadResult:
    """Read the configuration again and apply it: from `CONFIG_SOURCE`, or without one (an app
    built by `create_app` alone) the running settings, which re-reads the files they name."""
    async with app[RELOADS].lock:
        source = app.get(CONFIG_SOURCE)
        if source is None:
            return await _apply(app, app[LIVE].current.settings, None)
        try:
            loaded = source.read()
        except ConfigError as exc:
            return _refused(app, exc.message)
        return await _apply(app, loaded.settings, loaded.stated)


def schedule_reload(app: web.Application) -> asyncio.Task[ReloadResult]:
    """From a signal handler: the reload runs as a task, so the loop is never held up."""
    tasks = app[RELOADS].tasks
    task = asyncio.ensure_future(reload_config(app))
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def _apply(
    app: web.Application, new: Settings, stated: Collection[str] | None
) -> ReloadResult:
    live = app[LIVE]
    running = live.current.settings
    merged = merge(running, new)
    vocabularies = {m.name: m.vocabulary for m in app[SERVED_MODELS] if not m.speaks_codec}
    try:
        if merged.settings.safety_policy is not None:
            # Compiling a policy encodes every banned string with each model's tokenizer: a
            # thread, so that streams in flight keep flowing meanwhile.
            built = await asyncio.to_thread(build_live, merged.settings, vocabularies)
        else:
            built = build_live(merged.settings, vocabularies)
    except ConfigError as exc:
        return _refused(app, exc.message)
    except Exception as exc:  # anything else refuses the reload too; the process goes on
        return _refused(app, f"{type(exc).__name__}: {exc}")
    widened = widenings(running, live.current.api_keys, built.settings, built.api_keys)
    left_out = unstated(widened, stated)
    if left_out:
        return _refused(
            app,
            f"settings the configuration leaves out would widen access: "
            f'{", ".join(map(str, left_out))}; to mean it, write them (true, [] or "none")',
        )
    live.swap(built)
    current = live.current
    reread = tuple(
        name
        for name in REREAD_FILES
        if getattr(running, name) is not None and getattr(running, name) == getattr(new, name)
    )
    result = ReloadResult(
        True,
        changed=merged.changed,
        reread=reread,
        needs_restart=merged.needs_restart,
        widened=tuple(map(str, widened)),
        generation=current.generation,
    )
    # The new level first: the operator who asked for less logging gets it from this line on.
    logs.set_level(current.settings.log_level)
    warn = result.needs_restart or result.widened
    log.log(logging.WARNING if warn else logging.INFO, result.describe())
    app[METRICS].config_reloads.labels("ok").inc()
    for hook in app[ON_RELOAD]:
        try:
            hook(current)
        except Exception as exc:  # one feature's bug must not undo or hide the reload
            log.error("after the config reload, %r failed: %s: %s", hook, type(exc).__name__, exc)
    return result


def _refused(app: web.Application, message: str) -> ReloadResult:
    # One line whatever the parser said (a YAML error spans several).
    error = " ".join(message.split())
    result = ReloadResult(False, error=error, generation=app[LIVE].current.generation)
    log.error(result.describe())
    app[METRICS].config_reloads.labels("error").inc()
    return result
