"""No assert in the tests is true whatever it checks.

`assert sent == expected or EVERYTHING` reads like "sent is expected, or everything", but
parses as `(sent == expected) or "gzip, deflate, br, zstd"`: a non-empty string, so the assert
can never fail. ruff's SIM222 (selected) catches `x or "literal"` and F631 `assert (x, "msg")`,
but neither sees through a name: this scan resolves module-level constants, those of the module
and those it imports from this repository, and flags every assert whose condition, or one of
whose `and`-ed parts, is always true.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# The assert that started this scan (tests/server/test_coding_choice.py before it was fixed).
OLD_CODING_CHOICE = """
EVERYTHING = "gzip, deflate, br, zstd"

def test(sent, accept_encoding):
    assert sent == accept_encoding or EVERYTHING
"""


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    source: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: assert {self.source} is always true"


def module_file(module: str) -> Path | None:
    """The source of a module of this repository, if it is one."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def truthy_constants(path: Path) -> frozenset[str]:
    """Module-level names of `path` bound once, to a value that is always true, or imported
    as such from another module of this repository."""
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, int] = {}
    truthy: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            source = module_file(node.module)
            for alias in node.names:
                name = alias.asname or alias.name
                bound[name] = bound.get(name, 0) + 1
                if source is not None and alias.name in truthy_constants(source):
                    truthy.add(name)
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                bound[target.id] = bound.get(target.id, 0) + 1
                if always_true(value, frozenset(truthy)):
                    truthy.add(target.id)
    return frozenset(name for name in truthy if bound[name] == 1)


def always_true(node: ast.expr, constants: frozenset[str]) -> bool:
    """Whether `node` is true whatever the values it reads."""
    match node:
        case ast.Constant(value=value):
            return value is not Ellipsis and bool(value)
        case ast.Name(id=name):
            return name in constants
        case ast.Tuple(elts=elts) | ast.List(elts=elts) | ast.Set(elts=elts):
            return bool(elts)
        case ast.Dict(keys=keys):
            return bool(keys)
        case ast.JoinedStr(values=values):
            return any(isinstance(v, ast.Constant) and v.value for v in values)
        case ast.BoolOp(op=ast.Or(), values=values):
            return any(always_true(v, constants) for v in values)
        case ast.BoolOp(op=ast.And(), values=values):
            return all(always_true(v, constants) for v in values)
    return False


def always_true_asserts(source: str, path: str, constants: frozenset[str]) -> Iterator[Finding]:
    for node in ast.walk(ast.parse(source, path)):
        if not isinstance(node, ast.Assert):
            continue
        test = node.test
        parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else []
        if always_true(test, constants) or any(always_true(p, constants) for p in parts):
            yield Finding(path, node.lineno, ast.unparse(test))


def scan(path: Path) -> list[Finding]:
    relative = str(path.relative_to(ROOT))
    return list(always_true_asserts(path.read_text(), relative, truthy_constants(path)))


def test_no_assert_in_the_tests_is_always_true() -> None:
    findings = [f for path in sorted(TESTS.rglob("*.py")) for f in scan(path)]
    assert not findings, "\n".join(map(str, findings))


def test_the_scan_catches_the_assert_that_started_it(tmp_path: Path) -> None:
    module = tmp_path / "old_coding_choice.py"
    module.write_text(OLD_CODING_CHOICE)
    [finding] = always_true_asserts(OLD_CODING_CHOICE, module.name, truthy_constants(module))
    assert finding.line == 5
    assert finding.source == "sent == accept_encoding or EVERYTHING"


@pytest.mark.parametrize(
    "condition",
    [
        "x or 'y'",
        "x == 1 or NAME",
        "x or IMPORTED",
        "x and (y or NAME)",
        "(x, 'message')",
        "x or [1]",
        "x or f'{x} and more'",
        "NAME",
        "x or (NAME and 'y')",
    ],
)
def test_what_is_always_true(tmp_path: Path, condition: str) -> None:
    source = (
        "from tests.test_always_true_asserts import OLD_CODING_CHOICE as IMPORTED\n"
        f"NAME = 'a'\nassert {condition}\n"
    )
    module = tmp_path / "m.py"
    module.write_text(source)
    assert [f.source for f in always_true_asserts(source, "m.py", truthy_constants(module))] == [
        ast.unparse(ast.parse(condition, mode="eval").body)
    ]


@pytest.mark.parametrize(
    "condition",
    [
        "x == (y or NAME)",  # a default inside the comparison: fine
        "x or ''",
        "x or 0",
        "x or EMPTY",
        "x or REBOUND",  # bound twice: not a constant
        "x or NONE",
        "x and y",
        "x or (NAME and y)",
        "not (x or NAME)",
    ],
)
def test_what_is_not(tmp_path: Path, condition: str) -> None:
    source = (
        f"NAME = 'a'\nEMPTY = ()\nNONE = None\nREBOUND = 'a'\nREBOUND = ''\nassert {condition}\n"
    )
    module = tmp_path / "m.py"
    module.write_text(source)
    assert list(always_true_asserts(source, "m.py", truthy_constants(module))) == []
