"""proxy.core stays sans-IO: no event loop, no sockets, no files (style.md habit 1).

ruff's banned-api rule already flags the imports; this scan also catches file access and
string imports, and fails the tests even where a lint rule was silenced.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import proxy.core

CORE_DIR = Path(proxy.core.__file__).resolve().parent
CORE_MODULES = sorted(CORE_DIR.rglob("*.py"))

# pathlib is how files get read; a pure core has no use for paths.
BANNED_MODULES = frozenset({"asyncio", "aiohttp", "socket", "pathlib"})
# open(), io.open(), os.open(), codecs.open(), Path.open() and Path's whole-file helpers.
FILE_METHODS = frozenset({"open", "read_text", "read_bytes", "write_text", "write_bytes"})
STRING_IMPORTERS = frozenset({"__import__", "import_module"})


def io_uses(source: str, filename: str = "<source>") -> list[str]:
    """Every banned import or file access in `source`, as `line: what`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Import | ast.ImportFrom | ast.Call):
            continue
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else None
            attribute = func.attr if isinstance(func, ast.Attribute) else None
            if name == "open" or attribute in FILE_METHODS:
                found.append(f"{node.lineno}: file access {ast.unparse(func)}()")
            elif (name or attribute) in STRING_IMPORTERS and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    modules = [first.value]
        found += [
            f"{node.lineno}: imports {module}"
            for module in modules
            if module.partition(".")[0] in BANNED_MODULES
        ]
    return sorted(found, key=lambda use: int(use.partition(":")[0]))


def test_the_core_modules_are_found() -> None:
    names = {path.name for path in CORE_MODULES}
    assert {"__init__.py", "sse.py", "chunks.py", "frames.py", "codec_pb2.py"} <= names


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda path: str(path.relative_to(CORE_DIR)))
def test_core_module_does_no_io(path: Path) -> None:
    assert io_uses(path.read_text(encoding="utf-8"), str(path)) == []


def test_the_scan_catches_every_kind_of_io() -> None:
    source = "\n".join(
        [
            "import asyncio",
            "import aiohttp.web as web",
            "from socket import socket",
            "from pathlib import Path",
            "data = open('x').read()",
            "fd = os.open('x', 0)",
            "text = Path('x').read_text()",
            "Path('x').write_bytes(b'')",
            "with io.open('x') as fh: pass",
            "loop = __import__('asyncio')",
            "sock = importlib.import_module('socket.socket')",
            "from . import sse",
            "import os, json as asyncio_free",
        ]
    )
    assert [use.partition(":")[0] for use in io_uses(source)] == [str(n) for n in range(1, 12)]
