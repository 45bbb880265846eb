"""The core's folders are the pipeline's stages, and imports only run down them.

    errors ← wire ← http ← stream ← maps ← compression ← safety ← guard ← bodies ← steady
       ↖           ↙                     ↖                                    ↙
          backend                           verify ← render ← client
    (http: the upstream body asks each kind of backend in its own field; verify: the published
    map's decoder and a sampled stream's verdict, which a Codec body keeps; render: frames back
    to OpenAI JSON with that decoder and compression's decompressors; client: a Codec client's
    decisions, which read http's rollout refusal code and codings and the maps' header and
    assemble the renderer; `shown`, how a message shows a value it did not choose, is beside
    `errors`, below every stage)

A stage may import the stages its row in `MAY_IMPORT` names, and its own modules; the core
imports nothing of the rest of `proxy`; no module of `proxy` takes part in an import cycle; and
OpenTelemetry is loaded by one module (the spans'), which the worker's tracer loads only once
traces are on.
The graph is read from the source (`ast`), so a test failure names the offending import line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import proxy

PACKAGE_DIR = Path(proxy.__file__).resolve().parent
ROOT = PACKAGE_DIR.parent

# Each stage of the core, and the stages below it that it may use.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    # How a message shows a value it did not choose: bounded, quoted, credentials redacted.
    "shown": frozenset(),
    "wire": frozenset({"errors", "shown"}),
    "http": frozenset({"errors", "shown", "wire", "backend"}),
    "stream": frozenset({"errors", "shown", "wire"}),
    "maps": frozenset({"errors", "shown", "wire", "http", "stream"}),
    "compression": frozenset({"errors", "shown", "wire", "http", "maps"}),
    "backend": frozenset({"errors", "shown"}),
    "safety": frozenset({"errors", "shown", "wire", "stream"}),
    "guard": frozenset({"errors", "shown", "wire", "http", "stream", "safety"}),
    "verify": frozenset({"errors", "shown", "wire", "stream", "maps"}),
    "bodies": frozenset(
        {"errors", "shown", "wire", "http", "stream", "compression", "safety", "guard", "verify"}
    ),
    # The native steady path: a body's steady reads in C, folded back into the objects of
    # the Codec body it serves (its transcoder, guard and writer).
    "steady": frozenset(
        {
            "errors",
            "shown",
            "wire",
            "http",
            "stream",
            "compression",
            "safety",
            "guard",
            "verify",
            "bodies",
        }
    ),
    "endpoints": frozenset({"errors", "shown", "wire", "http", "stream", "safety"}),
    # Codec frames back to OpenAI JSON: the frame decoder, the published map's bytes (verify's
    # MapDecoder), a Codec body's content coding undone (compression's decompressors).
    "render": frozenset({"errors", "shown", "wire", "compression", "verify"}),
    # A Codec client: what it asks and how it reads a refusal (http's codes and codings), the
    # map an answer names (maps' header), what it trusts (compression's dictionaries, verify's
    # MapDecoder) and the renderer it assembles.
    "client": frozenset(
        {"errors", "shown", "wire", "http", "maps", "compression", "verify", "render"}
    ),
}


# The edge's groups, in the order imports may run: each may use the groups before it. The data
# plane knows nothing of models, routes or configuration; the control plane decides and hands
# it a StreamContext (docs/ARCHITECTURE.md, "Two planes").
SERVER_GROUPS: tuple[str, ...] = ("telemetry", "data", "models", "control", "process")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    module_name(path): path
    for path in sorted(PACKAGE_DIR.rglob("*.py"))
    if not path.name.endswith("_pb2.py")
}


def imports_of(name: str) -> Iterator[tuple[int, str]]:
    """(line, module of `proxy` imported), resolving `from pkg import module` to the module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in MODULES else base for t in targets]
        else:
            continue
        for target in targets:
            if target == "proxy" or target.startswith("proxy."):
                while target not in MODULES and "." in target:
                    target = target.rpartition(".")[0]
                if target in MODULES and target != name:
                    yield node.lineno, target


def stage(name: str) -> str | None:
    """The core stage a module belongs to (`errors`, `wire`, ..., `guard`); None outside."""
    parts = name.split(".")
    if parts[:2] != ["proxy", "core"] or len(parts) < 3:
        return None
    return parts[2]


def layering_violations() -> list[str]:
    found = []
    for name in MODULES:
        own = stage(name)
        if own is None:
            continue
        for line, target in imports_of(name):
            other = stage(target)
            if other is None:
                found.append(f"{name}:{line} imports {target}: the core imports only the core")
            elif other != own and other not in MAY_IMPORT[own]:
                found.append(f"{name}:{line} imports {target}: {own} may not use {other}")
    return found


def server_group(name: str) -> str | None:
    """The edge group a module belongs to (`telemetry`, `data`, ...); None outside them."""
    parts = name.split(".")
    if parts[:2] != ["proxy", "server"] or len(parts) < 4:
        return None
    return parts[2]


def server_violations() -> list[str]:
    found = []
    for name in MODULES:
        own = server_group(name)
        if own is None:
            continue
        for line, target in imports_of(name):
            other = server_group(target)
            if other is None:
                if target.startswith("proxy.server.") and target != "proxy.server":
                    found.append(f"{name}:{line} imports {target}, which is in no group")
                continue
            if SERVER_GROUPS.index(other) > SERVER_GROUPS.index(own):
                found.append(f"{name}:{line} imports {target}: {own} may not use {other}")
    return found


# The one module that imports OpenTelemetry, and the one that may import it: in a function or
# for type checking only, so that a proxy without an OTLP endpoint loads none of it
# (docs/ARCHITECTURE.md, "Where each concern lives").
OTEL_SPANS = "proxy.server.telemetry.otel_spans"
WORKER_TRACER = "proxy.server.telemetry.worker_tracer"


def top_level_imports(name: str) -> set[str]:
    """What `name` imports when it is loaded: its module body's imports, `if TYPE_CHECKING:`
    left out (any other block counts, so a try/except import is seen)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            pending.extend(node.orelse)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                pending.extend(getattr(node, block, []))
        elif isinstance(node, ast.ExceptHandler):
            pending.extend(node.body)
    return found


def opentelemetry_users() -> dict[str, set[str]]:
    """Modules of `proxy` that import OpenTelemetry, or the module that does, when loaded."""
    users: dict[str, set[str]] = {}
    for name in MODULES:
        loaded = {
            target
            for target in top_level_imports(name)
            if target.split(".")[0] == "opentelemetry" or target == OTEL_SPANS
        }
        if loaded:
            users[name] = loaded
    return users


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {name: sorted({target for _, target in imports_of(name)}) for name in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return cycles


def test_every_core_module_belongs_to_a_known_stage() -> None:
    stages = {stage(name) for name in MODULES} - {None}
    assert stages == set(MAY_IMPORT)


def test_core_imports_run_down_the_stages() -> None:
    assert layering_violations() == []


def test_every_server_module_is_in_a_group() -> None:
    loose = [
        name
        for name in MODULES
        if name.startswith("proxy.server.")
        and server_group(name) is None
        and name not in ("proxy.server.app", *(f"proxy.server.{g}" for g in SERVER_GROUPS))
    ]
    assert loose == []
    assert {server_group(name) for name in MODULES} - {None} == set(SERVER_GROUPS)


def test_server_imports_run_from_telemetry_to_process() -> None:
    assert server_violations() == []


def test_the_server_check_sees_an_upward_import(monkeypatch) -> None:
    real = imports_of

    def planted(name: str) -> Iterator[tuple[int, str]]:
        yield from real(name)
        if name == "proxy.server.data.stream":
            yield 1, "proxy.server.models.live"

    monkeypatch.setitem(globals(), "imports_of", planted)
    assert any("data may not use models" in v for v in server_violations())


def test_no_module_of_proxy_takes_part_in_an_import_cycle() -> None:
    assert import_cycles() == []


def test_the_checks_see_a_violation_and_a_cycle(monkeypatch) -> None:
    # The scan is only worth something if it fails: feed it an upward import and a cycle.
    real = imports_of

    def planted(name: str) -> Iterator[tuple[int, str]]:
        yield from real(name)
        if name == "proxy.core.wire.frames":
            yield 1, "proxy.core.stream.transcode"
        if name == "proxy.core.stream.transcode":
            yield 1, "proxy.core.wire.frames"

    monkeypatch.setitem(globals(), "imports_of", planted)
    assert any("wire may not use stream" in v for v in layering_violations())
    assert ["proxy.core.stream.transcode", "proxy.core.wire.frames"] in [
        [m for m in cycle if m in {"proxy.core.stream.transcode", "proxy.core.wire.frames"}]
        for cycle in import_cycles()
    ]


def test_only_the_span_module_loads_opentelemetry() -> None:
    users = opentelemetry_users()
    assert set(users) == {OTEL_SPANS}
    # The worker's tracer imports it only once traces are on (in a function).
    assert any(target == OTEL_SPANS for _, target in imports_of(WORKER_TRACER))
    assert WORKER_TRACER not in users


def test_the_opentelemetry_check_sees_a_module_that_loads_it(monkeypatch) -> None:
    real = top_level_imports

    def planted(name: str) -> set[str]:
        found = real(name)
        if name == "proxy.server.control.observe":
            found |= {OTEL_SPANS}
        return found

    monkeypatch.setitem(globals(), "top_level_imports", planted)
    assert "proxy.server.control.observe" in opentelemetry_users()
