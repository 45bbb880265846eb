"""`codec-proxy map generate` and `codec-proxy map verify`.

    codec-proxy map generate --tokenizer PATH --id ID [--out FILE]
    codec-proxy map verify FILE [--tokenizer PATH]

`generate` writes exactly the bytes the server would serve for that tokenizer and id (stdout
without --out), so a map generated offline and one served by `codec-proxy serve` hash the same.
`verify` checks a map against the schema and its own fields, and with --tokenizer also that it
describes that tokenizer: the same fields, and the same ids for every probe string.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from proxy.core.errors import TokenizerMapError
from proxy.core.maps.checks import map_differences, map_problems
from proxy.core.maps.tokenizer_map import map_document
from proxy.maps.publish import publish
from proxy.maps.schema import schema_problems
from proxy.tokenizers import LoadedTokenizer, TokenizerLoadError, load_tokenizer
from proxy.tokenizers.probes import PROBE_STRINGS


def _load(path: Path) -> LoadedTokenizer:
    try:
        return load_tokenizer(path)
    except TokenizerLoadError as exc:
        raise SystemExit(f"codec-proxy map: {exc.message}") from exc


def _write_atomically(path: Path, data: bytes) -> None:
    # A reader (a static file server, say) never sees half a map.
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as handle:
        handle.write(data)
    os.replace(handle.name, path)


def generate(args: argparse.Namespace) -> int:
    loaded = _load(args.tokenizer)
    content = loaded.map_content()
    try:
        published = publish(loaded, args.id, content=content)
    except TokenizerMapError as exc:
        raise SystemExit(f"codec-proxy map: {exc.message}") from exc
    if args.out is None:
        sys.stdout.buffer.write(published.body)
        sys.stdout.buffer.flush()
    else:
        _write_atomically(args.out, published.body)
    for caveat in content.caveats:
        print(f"warning: {caveat}", file=sys.stderr)
    program = "yes" if content.pre_tokenizer_program is not None else "no"
    print(
        f"{args.out or 'stdout'}: {published.id} {published.hash} ({len(published.body)} bytes, "
        f"vocab {content.vocab_size}, {content.encoder}, pre_tokenizer_program {program})",
        file=sys.stderr,
    )
    return 0


def _tokenizer_problems(path: Path, document: dict[str, Any], tokenizer_path: Path) -> list[str]:
    """Where the map at `path` and the tokenizer at `tokenizer_path` disagree."""
    loaded = _load(tokenizer_path)
    try:
        content = loaded.map_content()
    except TokenizerMapError as exc:
        return [f"the tokenizer has no map: {exc.message}"]
    # The id is the publisher's choice and not compared; any publishable one will do.
    expected = map_document("verify", content)
    problems = map_differences(expected, document)
    if problems:
        return problems
    from_map = _load(path)
    # A map has no normalizer (see the caveats), so both sides encode the normalized text.
    normalizer = loaded.tokenizer.normalizer
    differ = []
    for text in PROBE_STRINGS:
        mapped = from_map.tokenizer.encode(
            normalizer.normalize_str(text) if normalizer is not None and content.caveats else text,
            add_special_tokens=False,
        ).ids
        if mapped != loaded.tokenizer.encode(text, add_special_tokens=False).ids:
            differ.append(text)
    if differ:
        return [
            f"{len(differ)} of {len(PROBE_STRINGS)} probe strings encode differently, "
            f"e.g. {differ[0]!r}"
        ]
    return [f"warning: {caveat}" for caveat in content.caveats]


def verify(args: argparse.Namespace) -> int:
    path: Path = args.file
    try:
        body = path.read_bytes()
    except OSError as exc:
        raise SystemExit(f"codec-proxy map: cannot read {path}: {exc.strerror}") from exc
    print(f"{path}: sha256:{hashlib.sha256(body).hexdigest()} ({len(body)} bytes)")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        print(f"problem: not JSON: {exc}")
        return 1
    problems = schema_problems(document)
    if not problems:
        problems = map_problems(document)
    if not problems and args.tokenizer is not None:
        problems = _tokenizer_problems(path, document, args.tokenizer)
    failures = [problem for problem in problems if not problem.startswith("warning: ")]
    for problem in problems:
        print(problem if problem.startswith("warning: ") else f"problem: {problem}")
    if failures:
        return 1
    against = f" and matches {args.tokenizer}" if args.tokenizer is not None else ""
    print(f"ok: valid Codec tokenizer map {document['id']!r}{against}")
    return 0


def run(args: argparse.Namespace) -> int:
    handlers = {"generate": generate, "verify": verify}
    return handlers[args.map_command](args)
