"""Reloading the configuration in process: what changes, what waits for a restart, what a broken
file leaves alone, and streams in flight keeping the settings they started with."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config import ConfigSource
from proxy.core.wire.frames import Frame
from proxy.reloading import RUNTIME_KEYS, RUNTIME_MODEL_KEYS
from proxy.server import create_app
from proxy.server.models.live import LIVE, Live
from proxy.server.process.reload import (
    CONFIG_SOURCE,
    ON_RELOAD,
    ReloadResult,
    reload,
    reload_config,
    schedule_reload,
)
from proxy.server.telemetry.metrics import METRICS
from proxy.settings import ModelSettings
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.fake_upstream import FakeUpstream, Script, load_capture
from tests.server.conftest import AiohttpClient, MakeProxy, ProxyClient, app_of
from tests.server.policy_support import policy_document, v04, write_policy
from tests.server.support import frames_of, ids_of

REPO = Path(__file__).resolve().parents[2]
CODEC = {"prompt": "Hi", "max_tokens": 8, "stream_format": "msgpack"}
JSON = {"prompt": "Hi", "max_tokens": 8, "stream": True}
GZIP = {"Accept-Encoding": "gzip, identity;q=0"}
SAMPLE = load_capture("llamacpp-completions-sample.txt")


async def status_of(
    proxy: ProxyClient, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """A request's status, and its error code when it failed."""
    async with proxy.post("/v1/completions", json=body, headers=headers or {}) as resp:
        raw = await resp.read()
        code = json.loads(raw)["error"]["code"] if resp.status >= 400 else None
        return resp.status, code


async def reload_with(proxy: ProxyClient, **changes: Any) -> ReloadResult:
    """A reload whose file says what the running settings say, but for `changes`."""
    app = app_of(proxy)
    return await reload(app, dataclasses.replace(app[LIVE].current.settings, **changes))


def reloads(proxy: ProxyClient, result: str) -> float:
    value = app_of(proxy)[METRICS].registry.get_sample_value(
        "codec_proxy_config_reloads_total", {"result": result}
    )
    return value or 0.0


def reload_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "codec_proxy" and "config reload" in r.msg]


@pytest.fixture
def root_level() -> Iterator[None]:
    """A reload sets the root logger's level: put it back."""
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


# --------------------------------------------------------------------------- what applies


async def test_codec_turned_off_refuses_codec_and_json_still_passes(
    proxy: ProxyClient, caplog: pytest.LogCaptureFixture
) -> None:
    assert await status_of(proxy, CODEC) == (200, None)
    caplog.set_level(logging.INFO, "codec_proxy")
    result = await reload_with(proxy, codec_enabled=False)
    assert result.ok
    assert result.changed == ("codec_enabled",)
    assert result.generation == 1
    assert await status_of(proxy, CODEC) == (403, "codec_not_enabled")
    assert await status_of(proxy, JSON) == (200, None)
    [line] = reload_lines(caplog)
    assert line.getMessage() == "config reloaded (generation 1): changed codec_enabled"
    assert reloads(proxy, "ok") == 1
    assert reloads(proxy, "error") == 0
    # Codec is no longer available for the model, and the gauge says so.
    gauge = app_of(proxy)[METRICS].registry.get_sample_value(
        "codec_proxy_codec_available", {"model": "default"}
    )
    assert gauge == 0


async def test_a_model_switched_off_by_reload(
    make_proxy: MakeProxy, upstream_url: str, smollm2_gguf: Path
) -> None:
    model = ModelSettings(name="smollm2", upstreams=(upstream_url,), tokenizer=smollm2_gguf)
    proxy = await make_proxy(upstream=(), tokenizer=None, models=(model,))
    body = {**CODEC, "model": "smollm2"}
    assert await status_of(proxy, body) == (200, None)
    result = await reload_with(proxy, models=(dataclasses.replace(model, codec_enabled=False),))
    assert result.changed == ("models[smollm2].codec_enabled",)
    assert await status_of(proxy, body) == (403, "codec_not_enabled")
    assert await status_of(proxy, {**JSON, "model": "smollm2"}) == (200, None)


async def test_api_keys_added_by_reload_are_enforced_on_the_next_request(
    proxy: ProxyClient, tmp_path: Path
) -> None:
    assert await status_of(proxy, JSON) == (200, None)
    await reload_with(proxy, api_key=("k1",))
    assert await status_of(proxy, JSON) == (401, "invalid_api_key")
    assert await status_of(proxy, JSON, {"Authorization": "Bearer k1"}) == (200, None)
    # A key file rotated in place: every reload reads it again.
    keys = tmp_path / "keys"
    keys.write_text("k2\n")
    result = await reload_with(proxy, api_key=(), api_key_file=keys)
    assert result.changed == ("api_key", "api_key_file")
    assert await status_of(proxy, JSON, {"Authorization": "Bearer k2"}) == (200, None)
    keys.write_text("k3\n")
    result = await reload_config(app_of(proxy))  # no source: the running settings again
    assert result.ok
    assert result.changed == ()
    assert result.reread == ("api_key_file",)
    assert await status_of(proxy, JSON, {"Authorization": "Bearer k2"}) == (401, "invalid_api_key")
    assert await status_of(proxy, JSON, {"Authorization": "Bearer k3"}) == (200, None)


@pytest.mark.parametrize("text", ["", "# rotating: new keys follow\n\n"])
async def test_a_key_file_emptied_is_refused_and_the_keys_stay(
    proxy: ProxyClient, tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# the key of team a\nk1\n")
    assert (await reload_with(proxy, api_key_file=keys)).ok
    keys.write_text(text)  # an empty Secret mount, a rotation caught half-way
    caplog.clear()
    result = await reload_config(app_of(proxy))
    assert not result.ok
    assert result.error == (
        "'api_key_file' holds no API key (only blank lines or # comments); an empty key file "
        "never turns authentication off"
    )
    [line] = reload_lines(caplog)
    assert (line.levelno, line.getMessage()) == (
        logging.ERROR,
        f"config reload refused, nothing changed: {result.error}",
    )
    assert reloads(proxy, "error") == 1
    assert await status_of(proxy, JSON) == (401, "invalid_api_key")
    assert await status_of(proxy, JSON, {"Authorization": "Bearer k1"}) == (200, None)


async def test_the_log_level_changes(
    proxy: ProxyClient, caplog: pytest.LogCaptureFixture, root_level: None
) -> None:
    caplog.set_level(logging.DEBUG)  # capture everything; the root level decides what is logged
    await reload_with(proxy, log_level="WARNING")
    assert logging.getLogger().level == logging.WARNING
    assert not logging.getLogger("codec_proxy").isEnabledFor(logging.INFO)
    await reload_with(proxy, log_level="DEBUG")
    assert logging.getLogger("codec_proxy").isEnabledFor(logging.DEBUG)
    [line] = reload_lines(caplog)  # the first went out at the new WARNING level: not logged
    assert line.getMessage().endswith("changed log_level")


async def test_reload_hooks_get_the_new_snapshot_and_a_failing_one_undoes_nothing(
    proxy: ProxyClient, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Live] = []

    def broken(_: Live) -> None:
        raise RuntimeError("boom")

    app = app_of(proxy)
    app[ON_RELOAD].extend([broken, seen.append])
    result = await reload_with(proxy, verify_refuse_after=3)
    assert result.ok
    assert [live.settings.verify_refuse_after for live in seen] == [3]
    assert seen[0] is app[LIVE].current
    assert any("boom" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


# --------------------------------------------------------------------------- under load


async def read_stream(proxy: ProxyClient, started: asyncio.Event) -> list[Frame]:
    """A gzip Codec stream, read to its end; `started` is set at its first bytes."""
    async with proxy.post("/v1/completions", json=CODEC, headers=GZIP, auto_decompress=False) as r:
        assert r.status == 200
        assert r.headers["Content-Encoding"] == "gzip"
        body = bytearray()
        async for chunk in r.content.iter_any():
            body += chunk
            started.set()
    return frames_of(zlib.decompress(bytes(body), wbits=31), "msgpack")


async def test_streams_in_flight_keep_their_settings_through_a_reload(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    # Every frame flushed alone: the stream's frames are the transcoder's, one per commit.
    proxy = await make_proxy(flush_frames=1, flush_interval_ms=50)
    upstream.script = Script(SAMPLE, delay=0.02)  # about 0.7 s per stream
    baseline = await read_stream(proxy, asyncio.Event())
    assert len(baseline) > 10

    started = [asyncio.Event() for _ in range(4)]
    streams = [asyncio.ensure_future(read_stream(proxy, event)) for event in started]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 10)
    # Mid-stream: one flush for a whole stream, merged into one frame, and Codec off.
    result = await reload_with(
        proxy, flush_frames=10_000, flush_interval_ms=60_000, merge_frames=True, codec_enabled=False
    )
    try:
        assert result.changed == ("flush_interval_ms", "flush_frames", "codec_enabled")
        assert not any(stream.done() for stream in streams)  # the reload came mid-stream
        assert await status_of(proxy, CODEC, GZIP) == (403, "codec_not_enabled")
        assert await status_of(proxy, JSON) == (200, None)
        for frames in await asyncio.gather(*streams):
            assert frames == baseline  # decoded whole, one terminal frame, flushed as before
    finally:
        for stream in streams:
            stream.cancel()
        await asyncio.gather(*streams, return_exceptions=True)

    # Codec back on: a new stream has the new schedule, its IDs the same.
    await reload_with(proxy, codec_enabled=True)
    merged = await read_stream(proxy, asyncio.Event())
    assert len(merged) <= 3  # the first frame at once, the rest merged, the terminal one
    assert ids_of(merged) == ids_of(baseline)


async def test_a_safety_policy_added_by_reload_polices_new_streams_only(
    proxy: ProxyClient, upstream: FakeUpstream, tmp_path: Path
) -> None:
    upstream.script = Script(SAMPLE, delay=0.02)

    async def finish_reason(started: asyncio.Event) -> str | None:
        async with proxy.post("/v1/completions", json=CODEC, headers=v04()) as resp:
            raw = bytearray()
            async for chunk in resp.content.iter_any():
                raw += chunk
                started.set()
        return frames_of(bytes(raw), "msgpack")[-1].finish_reason

    started = asyncio.Event()
    before = asyncio.ensure_future(finish_reason(started))
    await asyncio.wait_for(started.wait(), 10)
    # Compiled against the tokenizer in a thread, while the stream goes on.
    result = await reload_with(proxy, safety_policy=write_policy(tmp_path))
    assert result.changed == ("safety_policy",)
    assert await finish_reason(asyncio.Event()) == "policy_violation"
    assert await before == "length"  # it started without a policy, and ends without one


async def test_reloads_are_applied_one_at_a_time_in_order(
    proxy: ProxyClient, tmp_path: Path
) -> None:
    # The first reload compiles a safety policy in a thread, so it awaits; the second does not.
    # Unserialized, the second would be applied while the first awaits, against the snapshot
    # the first started from, and then be undone by it.
    app = app_of(proxy)
    settings = app[LIVE].current.settings
    assert settings.safety_policy is None
    policy = write_policy(tmp_path)
    first = asyncio.ensure_future(
        reload(app, dataclasses.replace(settings, safety_policy=policy, flush_frames=7))
    )
    second = asyncio.ensure_future(reload(app, dataclasses.replace(settings, flush_frames=8)))
    results = await asyncio.gather(first, second)
    assert [r.ok for r in results] == [True, True]
    assert [r.generation for r in results] == [1, 2]
    # Each applied to the snapshot the one before left: the second takes the policy out again.
    assert [set(r.changed) for r in results] == [{"safety_policy", "flush_frames"}] * 2
    current = app[LIVE].current
    assert current.generation == 2
    assert (current.settings.flush_frames, current.settings.safety_policy) == (8, None)


# --------------------------------------------------------------------------- from a file


@dataclasses.dataclass
class FileProxy:
    client: ProxyClient
    config: Path
    base: str  # the file's first lines; a test appends to them

    def write(self, extra: str = "") -> None:
        self.config.write_text(self.base + extra)


@pytest.fixture
async def file_proxy(
    tmp_path: Path,
    upstream_url: str,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
) -> FileProxy:
    """A proxy configured by a file, as `codec-proxy serve --config` is."""
    config = tmp_path / "codec-proxy.toml"
    base = f'upstream = "{upstream_url}"\ntokenizer = "{smollm2_gguf}"\ndrift_check = false\n'
    config.write_text(base)
    source = ConfigSource(file=config, env=pinned_draws.environment(), flags={"flush_frames": 5})
    app = create_app(source.load(), smollm2_vocabulary)
    app[CONFIG_SOURCE] = source  # before the app starts, as the CLI does
    return FileProxy(await aiohttp_client(app), config, base)


async def test_signalled_reloads_read_and_apply_their_files_one_at_a_time(
    file_proxy: FileProxy, tmp_path: Path
) -> None:
    """Two SIGHUPs (`schedule_reload` is what the handler calls), the file rewritten between
    them: the second file is what stays. The first reload compiles a safety policy in a thread,
    so it awaits; unserialized, the second would read its file and be applied meanwhile, and the
    first would then put the older file back."""
    app = app_of(file_proxy.client)
    file_proxy.write(f'safety_policy = "{write_policy(tmp_path)}"\nflush_interval_ms = 10\n')
    first = schedule_reload(app)
    await asyncio.sleep(0)  # the first has read its file, and awaits the policy's compilation
    file_proxy.write('safety_policy = "none"\nflush_interval_ms = 20\n')
    second = schedule_reload(app)
    results = await asyncio.gather(first, second)
    assert [(r.ok, r.generation) for r in results] == [(True, 1), (True, 2)]
    # Each read and applied after the one before: the second takes the policy out again.
    assert [set(r.changed) for r in results] == [{"safety_policy", "flush_interval_ms"}] * 2
    current = app[LIVE].current
    assert current.generation == 2
    assert (current.settings.flush_interval_ms, current.settings.safety_policy) == (20, None)


async def test_a_reload_reads_the_file_again_and_flags_still_beat_it(
    file_proxy: FileProxy,
) -> None:
    proxy = file_proxy.client
    file_proxy.write("codec_enabled = false\nflush_frames = 9\nflush_interval_ms = 10\n")
    result = await reload_config(app_of(proxy))
    assert result.changed == ("flush_interval_ms", "codec_enabled")
    settings = app_of(proxy)[LIVE].current.settings
    assert settings.flush_frames == 5  # the flag
    assert await status_of(proxy, CODEC) == (403, "codec_not_enabled")


def _policy_with_a_token_id_beyond_the_vocabulary(directory: Path) -> Path:
    document = policy_document()
    document["rules"]["banned_ids"][0]["sequences"] = [[10_000_000]]
    return write_policy(directory, document)


BROKEN = {
    "a bad value": ("flush_frames = -1\n", "'flush_frames' must be >= 0, got -1"),
    "an unknown key": ("flush_framez = 3\n", "unknown key 'flush_framez'"),
    "not TOML": ("codec_enabled = \n", "not valid TOML"),
    "an unreadable file": (None, "cannot read"),
    "enforcement without a policy": (
        "enforce_safety_policy = true\n",
        "enforce_safety_policy needs a safety policy file (safety_policy)",
    ),
    "a policy that does not compile": (
        "policy",
        "policy.json: rules.banned_ids[0].sequences[0] holds a value that is not a token ID of "
        "this model",
    ),
}


@pytest.mark.parametrize(("extra", "problem"), BROKEN.values(), ids=BROKEN.keys())
async def test_a_broken_reload_changes_nothing(
    file_proxy: FileProxy,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    extra: str | None,
    problem: str,
) -> None:
    proxy, app = file_proxy.client, app_of(file_proxy.client)
    before = app[LIVE].current
    if extra is None:
        file_proxy.config.unlink()
    elif extra == "policy":
        policy = _policy_with_a_token_id_beyond_the_vocabulary(tmp_path)
        # Codec off too: a reload is applied whole or not at all.
        file_proxy.write(f'codec_enabled = false\nsafety_policy = "{policy}"\n')
    else:
        file_proxy.write("codec_enabled = false\n" + extra)
    caplog.set_level(logging.INFO, "codec_proxy")
    result = await reload_config(app)
    assert not result.ok
    assert result.error is not None
    assert problem in result.error
    assert app[LIVE].current is before
    assert await status_of(proxy, CODEC) == (200, None)
    [line] = [r for r in caplog.records if r.name == "codec_proxy" and r.levelno >= logging.ERROR]
    message = line.getMessage()
    assert message.startswith("config reload refused, nothing changed: ")
    assert problem in message
    assert "\n" not in message
    assert reloads(proxy, "error") == 1
    assert reloads(proxy, "ok") == 0


SECRETS = {
    "a YAML error on the key's line": (
        'api_key: ["sk-live-4b9f8e21]\n',
        "not valid YAML: found unexpected end of stream (at line 5, column 1)",
    ),
    "a YAML alias named like the key": (
        "api_key: *sk-live-4b9f8e21\n",
        "not valid YAML: found undefined alias … (at line 4, column 10)",
    ),
    "a key of the wrong type": (
        "api_key: 12345678901234\n",
        "'api_key' must be a list of a string, got an integer (secret: not shown)",
    ),
}


@pytest.mark.parametrize(("broken", "problem"), SECRETS.values(), ids=SECRETS.keys())
async def test_a_refused_reload_never_logs_a_secret(
    tmp_path: Path,
    upstream_url: str,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
    caplog: pytest.LogCaptureFixture,
    broken: str,
    problem: str,
) -> None:
    config = tmp_path / "codec-proxy.yaml"
    base = f"upstream: {upstream_url}\ntokenizer: {smollm2_gguf}\ndrift_check: false\n"
    config.write_text(base + "api_key: [sk-live-4b9f8e21]\n")
    source = ConfigSource(file=config, env=pinned_draws.environment())
    app = create_app(source.load(), smollm2_vocabulary)
    app[CONFIG_SOURCE] = source
    await aiohttp_client(app)
    config.write_text(base + broken)
    result = await reload_config(app)
    assert result.error == f"{config}: {problem}"
    [line] = reload_lines(caplog)
    assert line.getMessage() == f"config reload refused, nothing changed: {result.error}"
    assert "sk-live-4b9f8e21" not in caplog.text
    assert "12345678901234" not in caplog.text


# --------------------------------------------------------------------------- what widens access


@dataclasses.dataclass
class Guarded:
    """A proxy whose file holds keys, a deny-list, a policy, and Codec switched off."""

    client: ProxyClient
    config: Path
    lines: list[str]  # the file's lines, as first written

    async def reload(self, text: str) -> ReloadResult:
        self.config.write_text(text)
        return await reload_config(app_of(self.client))


@pytest.fixture
async def guarded(
    tmp_path: Path,
    upstream_url: str,
    smollm2_gguf: Path,
    smollm2_vocabulary: Vocabulary,
    aiohttp_client: AiohttpClient,
) -> Guarded:
    keys = tmp_path / "keys"
    keys.write_text("k1\n")
    lines = [
        f'api_key_file = "{keys}"',
        "codec_enabled = false",
        'codec_deny_keys = ["k2"]',
        f'safety_policy = "{write_policy(tmp_path)}"',
        "flush_frames = 7",
    ]
    config = tmp_path / "codec-proxy.toml"
    config.write_text("\n".join(lines) + "\n")
    # Upstream and tokenizer from flags: an emptied file still loads.
    flags = {"upstream": upstream_url, "tokenizer": smollm2_gguf, "drift_check": False}
    source = ConfigSource(file=config, env=pinned_draws.environment(), flags=flags)
    app = create_app(source.load(), smollm2_vocabulary)
    app[CONFIG_SOURCE] = source
    return Guarded(await aiohttp_client(app), config, lines)


KEY = {"Authorization": "Bearer k1"}


@pytest.mark.parametrize("kept", [3, 1, 0], ids=["cut after 3 lines", "after 1", "emptied"])
async def test_a_file_cut_short_or_emptied_drops_nothing(
    guarded: Guarded, caplog: pytest.LogCaptureFixture, kept: int
) -> None:
    """Editors and `>` truncate before they write, and watchers signal on each write: a file
    cut at a line boundary is valid, and must not be taken for a wish to open the proxy."""
    app = app_of(guarded.client)
    before = app[LIVE].current
    caplog.set_level(logging.INFO, "codec_proxy")
    cut = "".join(line + "\n" for line in guarded.lines[:kept])
    result = await guarded.reload(cut)
    assert not result.ok
    left_out = [
        "every API key removed: no key needed (api_key_file)",
        "Codec switched on (codec_enabled)",
        "deny-list emptied (codec_deny_keys)",
        "safety policy removed (safety_policy)",
    ][kept:]
    assert result.error == (
        f"settings the configuration leaves out would widen access: {', '.join(left_out)}; "
        'to mean it, write them (true, [] or "none")'
    )
    assert app[LIVE].current is before
    [line] = reload_lines(caplog)
    assert (line.levelno, line.getMessage()) == (
        logging.ERROR,
        f"config reload refused, nothing changed: {result.error}",
    )
    assert reloads(guarded.client, "error") == 1
    assert await status_of(guarded.client, JSON) == (401, "invalid_api_key")
    assert await status_of(guarded.client, CODEC, KEY) == (403, "codec_not_enabled")


async def test_what_the_file_states_may_widen_access_and_is_logged_as_a_warning(
    guarded: Guarded, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "codec_proxy")
    # One list narrowed, the rest explicitly removed: applied, with a warning naming each.
    result = await guarded.reload(
        'api_key_file = "none"\ncodec_enabled = true\ncodec_deny_keys = []\n'
        'safety_policy = "none"\ncodec_allow_keys = ["k3"]\n'
    )
    assert result.ok
    assert result.widened == (
        "every API key removed: no key needed (api_key_file)",
        "Codec switched on (codec_enabled)",
        "deny-list emptied (codec_deny_keys)",
        "safety policy removed (safety_policy)",
    )
    [line] = reload_lines(caplog)
    assert line.levelno == logging.WARNING
    assert line.getMessage() == (
        "config reloaded (generation 1): changed api_key_file, safety_policy, flush_frames, "
        "codec_enabled, codec_allow_keys, codec_deny_keys; widens access: "
        + ", ".join(result.widened)
    )
    assert await status_of(guarded.client, JSON) == (200, None)
    assert await status_of(guarded.client, CODEC) == (403, "codec_not_enabled")  # not allowed
    # Narrowing again is an ordinary reload: INFO, nothing widened.
    caplog.clear()
    result = await guarded.reload('codec_enabled = false\ncodec_allow_keys = ["k3"]\n')
    assert result.widened == ()
    [line] = reload_lines(caplog)
    assert (line.levelno, line.getMessage()) == (
        logging.INFO,
        "config reloaded (generation 2): changed codec_enabled",
    )


async def test_restart_only_keys_are_named_and_kept(
    make_proxy: MakeProxy,
    upstream: FakeUpstream,
    upstream_url: str,
    smollm2_gguf: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ModelSettings(name="smollm2", upstreams=(upstream_url,), tokenizer=smollm2_gguf)
    proxy = await make_proxy(upstream=(), tokenizer=None, models=(model,))
    running = app_of(proxy)[LIVE].current.settings
    moved = dataclasses.replace(
        model, upstreams=("http://127.0.0.1:9",), tokenizer=tmp_path / "other.gguf", flush_frames=7
    )
    caplog.set_level(logging.INFO, "codec_proxy")
    result = await reload_with(proxy, port=running.port + 1, workers=4, models=(moved,))
    assert result.ok
    assert result.changed == ("models[smollm2].flush_frames",)
    assert result.needs_restart == (
        "port",
        "models[smollm2].upstreams",
        "models[smollm2].tokenizer",
        "workers",
    )
    [line] = reload_lines(caplog)
    assert line.levelno == logging.WARNING
    assert line.getMessage().endswith(
        "needs a restart: port, models[smollm2].upstreams, models[smollm2].tokenizer, workers "
        "(kept as they were)"
    )
    live = app_of(proxy)[LIVE].current
    assert (live.settings.port, live.settings.workers) == (running.port, running.workers)
    assert live.model("smollm2").upstreams == (upstream_url,)
    assert live.model("smollm2").tokenizer == smollm2_gguf
    assert live.model("smollm2").flush_frames == 7
    # Still served by the upstream it started with.
    assert await status_of(proxy, {**CODEC, "model": "smollm2"}) == (200, None)
    assert upstream.requests[-1].path_qs == "/v1/completions"


async def test_a_renamed_or_added_model_needs_a_restart(
    make_proxy: MakeProxy, upstream_url: str, smollm2_gguf: Path
) -> None:
    model = ModelSettings(name="smollm2", upstreams=(upstream_url,), tokenizer=smollm2_gguf)
    proxy = await make_proxy(upstream=(), tokenizer=None, models=(model,))
    renamed = dataclasses.replace(model, name="smol")
    result = await reload_with(proxy, models=(renamed,))
    assert result.needs_restart == ("models[smol] (new)", "models[smollm2] (removed)")
    assert list(app_of(proxy)[LIVE].current.models) == ["smollm2"]


async def test_a_changed_tokenizer_of_the_single_model_needs_a_restart(
    proxy: ProxyClient, tmp_path: Path
) -> None:
    result = await reload_with(proxy, tokenizer=tmp_path / "other.gguf", host="0.0.0.0")
    assert result.needs_restart == ("tokenizer", "host")
    assert app_of(proxy)[LIVE].current.settings.host == "127.0.0.1"


# --------------------------------------------------------------------------- the docs


def test_the_deploy_guide_lists_exactly_the_runtime_keys() -> None:
    text = (REPO / "docs" / "DEPLOY.md").read_text()
    section = text.split("## Changes without restarts", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| ")][1:]  # not the head
    listed = [key for row in table for key in row.split("|")[2].replace("`", "").split(", ")]
    listed = [key.strip() for key in listed]
    assert [k for k in listed if not k.startswith("models[].")] == list(RUNTIME_KEYS)
    assert [k.removeprefix("models[].") for k in listed if k.startswith("models[].")] == list(
        RUNTIME_MODEL_KEYS
    )
