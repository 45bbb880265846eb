"""Builds the native steady path (proxy/core/steady/_steady.c); everything else is in
pyproject.toml. `pip install -e .` builds it in place with gcc and the Python headers.

`CODEC_PROXY_NO_EXTENSIONS=1` builds nothing: the proxy then runs the Python path only, and
must be run with the same variable set (proxy/core/steady/__init__.py checks at import).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = Path("proxy/core/steady/_steady.c")


class LoudBuildExt(build_ext):
    """A failed build says what to do instead of leaving a proxy without its native path."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            raise SystemExit(
                f"building the native steady path ({SOURCE}) failed: {exc}\n"
                "install gcc and the Python headers, or set CODEC_PROXY_NO_EXTENSIONS=1 to "
                "build and run the Python path only"
            ) from exc


def extensions() -> list[Extension]:
    if os.environ.get("CODEC_PROXY_NO_EXTENSIONS"):
        return []
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    return [
        Extension(
            "proxy.core.steady._steady",
            [str(SOURCE)],
            # The source's hash, checked at import: a build older than the source is refused.
            define_macros=[("STEADY_SOURCE_HASH", f'"{digest}"')],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]


setup(ext_modules=extensions(), cmdclass={"build_ext": LoudBuildExt})
