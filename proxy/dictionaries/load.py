"""Load the zstd dictionaries at start: from the manifest, or per format from `--zstd-dict`.

Every dictionary that a manifest lists is checked against it (sha256 and size) before it is
used; a mismatch is fatal. The proxy must never advertise a hash other than that of the bytes
it compresses with (codec-spec.md §10), and WKD v0.5 says to "hard-fail engine boot".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from proxy.core.compression.dictionaries import (
    WIRE_FORMATS,
    DictionaryError,
    LoadedZstdDictionary,
    ManifestEntry,
    ZstdDictionaries,
    parse_manifest,
    sha256_hex,
)

log = logging.getLogger("codec_proxy")

MANIFEST_NAME = "manifest.json"


def parse_dict_option(value: str) -> tuple[str, Path]:
    """`msgpack=PATH` or `protobuf=PATH`."""
    fmt, sep, path = value.partition("=")
    fmt = fmt.strip().lower()
    if not sep or fmt not in WIRE_FORMATS or not path:
        raise DictionaryError(
            f"--zstd-dict {value!r}: expected FORMAT=PATH with FORMAT one of {WIRE_FORMATS}"
        )
    return fmt, Path(path)


def load_dictionaries(
    manifest: Path | None,
    explicit: Sequence[str] = (),
    *,
    vocabulary_sha256: str | None = None,
    manifest_required: bool = False,
) -> ZstdDictionaries:
    """The dictionaries to serve. `DictionaryError` (refuse to start) on any mismatch.

    Manifest entries trained for another tokenizer (`vocabulary_sha256` differs) are skipped:
    they would still decode correctly, but zstd is preferred over br, so a dictionary that does
    not fit the model's IDs would make every zstd response worse than br.
    """
    chosen: dict[str, LoadedZstdDictionary] = {}
    if manifest is not None and (manifest_required or manifest.exists()):
        for entry in read_manifest(manifest):
            if vocabulary_sha256 is not None and entry.extra.get("vocabulary_sha256") not in (
                None,
                vocabulary_sha256,
            ):
                log.info("zstd dictionary %s: trained for another tokenizer, not used", entry.file)
                continue
            if entry.format in chosen:
                raise DictionaryError(f"{manifest}: two dictionaries for format {entry.format!r}")
            chosen[entry.format] = _load_entry(manifest.parent / entry.file, entry)
    overrides: dict[str, LoadedZstdDictionary] = {}
    for option in explicit:
        fmt, path = parse_dict_option(option)
        if fmt in overrides:
            raise DictionaryError(f"--zstd-dict given twice for format {fmt!r}")
        overrides[fmt] = _load_explicit(fmt, path, manifest, vocabulary_sha256)
    chosen.update(overrides)
    return ZstdDictionaries(chosen.values())


def read_manifest(path: Path) -> list[ManifestEntry]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise DictionaryError(f"cannot read dictionary manifest {path}: {exc.strerror}") from exc
    return parse_manifest(text, source=str(path))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DictionaryError(f"cannot read zstd dictionary {path}: {exc.strerror}") from exc


def _load_entry(path: Path, entry: ManifestEntry) -> LoadedZstdDictionary:
    data = _read(path)
    digest = sha256_hex(data)
    if digest != entry.sha256 or len(data) != entry.size_bytes:
        raise DictionaryError(
            f"zstd dictionary {path} does not match its manifest: sha256 {digest} "
            f"({len(data)} bytes), manifest says {entry.sha256} ({entry.size_bytes} bytes); "
            "refusing to start"
        )
    if entry.format not in WIRE_FORMATS:
        raise DictionaryError(f"zstd dictionary {path}: unknown format {entry.format!r}")
    return LoadedZstdDictionary.build(
        entry.format, data, trained_at=entry.trained_at, corpus_summary=entry.corpus_summary
    )


def _load_explicit(
    fmt: str, path: Path, manifest: Path | None, vocabulary_sha256: str | None
) -> LoadedZstdDictionary:
    """A `--zstd-dict` file: verified by the manifest that lists it, if any does; one that a
    manifest says was trained for another tokenizer is refused (it was asked for by name, so
    skipping it would silently serve something else)."""
    resolved = path.resolve()
    for candidate in _manifests_for(path, manifest):
        for entry in read_manifest(candidate):
            if (candidate.parent / entry.file).resolve() == resolved:
                if entry.format != fmt:
                    raise DictionaryError(
                        f"--zstd-dict {fmt}={path}: the manifest {candidate} lists it as a "
                        f"{entry.format} dictionary"
                    )
                trained_for = entry.extra.get("vocabulary_sha256")
                if vocabulary_sha256 is not None and trained_for not in (None, vocabulary_sha256):
                    raise DictionaryError(
                        f"zstd dictionary {path} was trained for another tokenizer (vocabulary "
                        f"sha256 {trained_for}, this model's is {vocabulary_sha256})"
                    )
                return _load_entry(path, entry)
    log.info("zstd dictionary %s is in no manifest; serving it by its own sha256", path)
    return LoadedZstdDictionary.build(fmt, _read(path))


def _manifests_for(path: Path, manifest: Path | None) -> list[Path]:
    candidates = [p for p in (manifest, path.parent / MANIFEST_NAME) if p is not None]
    unique: Mapping[Path, Path] = {p.resolve(): p for p in candidates if p.exists()}
    return list(unique.values())
