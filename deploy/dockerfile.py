"""Check deploy/Dockerfile without a Docker engine: lint it, and run its build steps here.

    python -m deploy.dockerfile lint [DOCKERFILE]
    python -m deploy.dockerfile build-steps --root DIR [DOCKERFILE]

`lint` reports what must hold for the image: a pinned base, a numeric non-root USER, no secret
in ENV/ARG or in a COPY, a HEALTHCHECK on /livez, `codec-proxy serve` as the entry point, no
compiler in the final stage, and an ignore file that keeps `.env` and friends out of the context.

`build-steps` executes the Dockerfile's own instructions (WORKDIR, COPY, ENV, ARG, RUN) under a
scratch directory standing in for the image's `/`, with this machine's Python in place of the
base image's (linked at <root>/usr/local/bin/python); both must have the same minor version.
Every stage shares that one root (in a real build each has its own), so the final stage's
`COPY --from=build /opt/x /opt/x` finds the virtualenv where the build made it; its RUN steps
(creating the user) are listed, not run. Image paths in ENV values are mapped under the root;
RUN commands may not name absolute paths at all (use WORKDIR-relative paths and variables),
which keeps them runnable anywhere.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DOCKERFILE = Path(__file__).resolve().parent / "Dockerfile"

# Names that mark a variable as a credential. Docker's own check (SecretsUsedInArgOrEnv) warns
# on the same words: build arguments and ENV values stay readable in the image's history.
# A name ending in _FILE holds the path to a mounted secret, not the secret.
_SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)(?!.*_FILE$)", re.IGNORECASE
)
# Literal credentials wherever they appear.
_SECRET_VALUE = re.compile(
    r"AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY-----|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}|\bhf_[A-Za-z0-9]{30,}|\bxox[abp]-[A-Za-z0-9-]{10,}"
)
# Files that hold credentials; never copied into an image.
_SECRET_FILES = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".dockercfg",
    "credentials*",
    ".aws",
    ".ssh",
    ".gnupg",
    "*.kubeconfig",
    "kubeconfig",
)
# A pinned base: a digest, or a tag carrying an exact x.y.z version.
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_EXACT_TAG = re.compile(r":[^/@:]*\d+\.\d+\.\d+[^/@:]*$")
_COMPILERS = re.compile(
    r"\b(gcc|g\+\+|cc|c\+\+|clang|build-essential|make|cmake|gfortran|rustc|cargo)\b"
)
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_PYTHON_IMAGE = re.compile(r"(?:^|/)python:(\d+)\.(\d+)")


class DockerfileError(Exception):
    """The Dockerfile cannot be read, or one of its build steps failed."""


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    args: str  # everything after the keyword, continuation lines joined
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array form's items, or None for the shell form."""
        return _json_array(self.args)


@dataclass
class Stage:
    base: str  # as resolved with the global ARG defaults
    name: str | None
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    preamble: list[Instruction]  # the ARGs before the first FROM
    stages: list[Stage]

    @property
    def global_args(self) -> dict[str, str]:
        return dict(arg_pair(i.args) for i in self.preamble)

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage_names(self) -> set[str]:
        return {s.name for s in self.stages if s.name}

    def ignore_file(self) -> Path:
        """BuildKit's per-Dockerfile ignore file: `<Dockerfile>.dockerignore` beside it."""
        return self.path.with_name(self.path.name + ".dockerignore")

    def env(self, stage: Stage) -> dict[str, str]:
        """The variables a stage sets (ENV), in image terms."""
        values: dict[str, str] = {}
        for instruction in stage.all("ENV"):
            for name, raw in env_pairs(instruction.args):
                values[name] = expand(raw, values)
        return values


def _json_array(text: str) -> list[str] | None:
    if not text.startswith("["):
        return None
    try:
        items = json.loads(text)
    except ValueError:
        return None
    if isinstance(items, list) and all(isinstance(i, str) for i in items):
        return items
    return None


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, instruction text) with continuations joined and comments dropped."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped too, as Docker does
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        yield start, "".join(pending).strip()
        pending = []
    if pending:
        raise DockerfileError(f"line {start}: the last instruction ends with a continuation")


def expand(text: str, env: Mapping[str, str], *, keep_unknown: bool = False) -> str:
    """`$NAME` and `${NAME}` as Docker substitutes them (unset: empty, or kept as written)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0) if keep_unknown else "")

    return _VARIABLE.sub(value, text)


def arg_pair(args: str) -> tuple[str, str]:
    """`ARG NAME=default` (or `ARG NAME`) as (name, default or "")."""
    name, _, default = args.partition("=")
    return name.strip(), default.strip().strip('"')


def env_pairs(args: str) -> list[tuple[str, str]]:
    """`ENV a=1 b="x y"` (or the legacy `ENV a 1`) as (name, unexpanded value) pairs."""
    tokens = shlex.split(args)
    if tokens and "=" not in tokens[0]:
        return [(tokens[0], " ".join(tokens[1:]))]
    pairs = []
    for token in tokens:
        name, sep, value = token.partition("=")
        if not sep:
            raise DockerfileError(f"ENV {args!r}: {token!r} is not NAME=value")
        pairs.append((name, value))
    return pairs


def parse(path: Path) -> Dockerfile:
    try:
        text = path.read_text()
    except OSError as exc:
        raise DockerfileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    preamble: list[Instruction] = []
    stages: list[Stage] = []
    for line, logical in _logical_lines(text):
        keyword, _, args = logical.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip(), line)
        if instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            global_args = dict(arg_pair(i.args) for i in preamble)
            stages.append(Stage(expand(words[0], global_args), name, line))
        elif not stages:
            if instruction.keyword != "ARG":
                raise DockerfileError(f"{path}:{line}: only ARG may come before the first FROM")
            preamble.append(instruction)
        else:
            stages[-1].instructions.append(instruction)
    if not stages:
        raise DockerfileError(f"{path}: no FROM")
    return Dockerfile(path, preamble, stages)


# --- .dockerignore --------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRules:
    """The subset of .dockerignore that matters here: globs, `**/`, `!` exceptions, last wins."""

    patterns: tuple[tuple[str, bool], ...]  # (pattern, is_exception)

    @classmethod
    def read(cls, path: Path) -> IgnoreRules:
        rules = []
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exception = line.startswith("!")
            pattern = line.lstrip("!").strip().strip("/")
            rules.append((pattern, exception))
        return cls(tuple(rules))

    def ignored(self, relpath: str) -> bool:
        """Whether a context path (relative, '/'-separated) is left out of the build context."""
        parts = relpath.strip("/").split("/")
        # A path is excluded when it, or a directory above it, matches.
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        result = False
        for pattern, exception in self.patterns:
            if any(_ignore_match(pattern, p) for p in prefixes):
                result = not exception
        return result


def _ignore_match(pattern: str, path: str) -> bool:
    """Go's filepath.Match plus `**` (any number of directories), as Docker matches."""
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            regex += ".*"
            i += 2
        elif pattern[i] == "*":
            regex += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            regex += "[^/]"
            i += 1
        else:
            regex += re.escape(pattern[i])
            i += 1
    return re.fullmatch(regex, path) is not None


# --- lint -----------------------------------------------------------------------------------


def lint(dockerfile: Dockerfile) -> list[str]:
    """Every problem found, as `file:line: message`; empty when the Dockerfile is fine."""
    problems: list[str] = []
    where = dockerfile.path.name

    def problem(line: int, message: str) -> None:
        problems.append(f"{where}:{line}: {message}")

    names = dockerfile.stage_names()
    for stage in dockerfile.stages:
        if stage.base in names:
            continue
        if not (_DIGEST.search(stage.base) or _EXACT_TAG.search(stage.base)):
            problem(stage.line, f"base image {stage.base!r} is not pinned (exact tag or digest)")
        if stage.base.endswith(":latest"):
            problem(stage.line, f"base image {stage.base!r} uses the moving 'latest' tag")

    text = dockerfile.path.read_text()
    for number, line in enumerate(text.splitlines(), 1):
        if _SECRET_VALUE.search(line):
            problem(number, "a literal credential")

    for instruction in dockerfile.preamble + [i for s in dockerfile.stages for i in s.instructions]:
        _lint_instruction(instruction, names, problem)

    final = dockerfile.final
    users = final.all("USER")
    if not users:
        problem(final.line, "the final stage sets no USER: the process would run as root")
    else:
        user, _, group = users[-1].args.partition(":")
        if not user.isdigit() or (group and not group.isdigit()):
            problem(users[-1].line, f"USER {users[-1].args}: use a numeric uid[:gid]")
        elif int(user) == 0 or (group and int(group) == 0):
            problem(users[-1].line, f"USER {users[-1].args} is root")
    for run in final.all("RUN"):
        if re.search(r"\b(apt-get|apt|apk|dnf|yum)\b.*\binstall\b", run.args) and (
            _COMPILERS.search(run.args)
        ):
            problem(run.line, "the final stage installs a compiler or build tool")
    entrypoints = final.all("ENTRYPOINT")
    entrypoint = entrypoints[-1].exec_form() if entrypoints else None
    if entrypoint is None or entrypoint[:2] != ["codec-proxy", "serve"]:
        problem(final.line, 'the entry point must be the exec form ["codec-proxy", "serve", ...]')
    checks = final.all("HEALTHCHECK")
    if not checks or "/livez" not in checks[-1].args:
        problem(final.line, "no HEALTHCHECK on /livez in the final stage")

    ignore = dockerfile.ignore_file()
    if not ignore.exists():
        problem(1, f"no {ignore.name} beside the Dockerfile: the whole context would be sent")
    else:
        rules = IgnoreRules.read(ignore)
        for path in (".env", "deploy/.env", ".env.local", ".git/config", ".venv/bin/python"):
            if not rules.ignored(path):
                problems.append(f"{ignore.name}: {path} is not excluded from the build context")
    return problems


def _lint_instruction(
    instruction: Instruction, stage_names: set[str], problem: Callable[[int, str], None]
) -> None:
    keyword, args = instruction.keyword, instruction.args
    if keyword == "ARG":
        name = args.partition("=")[0].strip()
        if _SECRET_NAME.search(name):
            problem(instruction.line, f"ARG {name} looks like a secret: ARGs stay in the history")
    elif keyword == "ENV":
        for name, _ in env_pairs(args):
            if _SECRET_NAME.search(name):
                problem(instruction.line, f"ENV {name} looks like a secret: ENV is in the image")
    elif keyword in ("COPY", "ADD"):
        words = instruction.exec_form() or shlex.split(args)
        flags = [w for w in words if w.startswith("--")]
        sources = [w for w in words if not w.startswith("--")][:-1]
        from_stage = any(f.startswith("--from=") for f in flags)
        for source in sources:
            if keyword == "ADD" and re.match(r"[a-z]+://", source):
                problem(instruction.line, f"ADD {source}: fetch pinned files in a RUN step")
            if not from_stage and source.strip("./") == "":
                problem(instruction.line, f"{keyword} {source}: copies the whole build context")
            base = source.rstrip("/").rsplit("/", 1)[-1]
            if any(fnmatch.fnmatchcase(base, pattern) for pattern in _SECRET_FILES):
                problem(instruction.line, f"{keyword} {source}: a credentials file")
        for flag in flags:
            if flag.startswith("--from=") and flag[7:] not in stage_names:
                problem(instruction.line, f"{flag}: copy from a named stage of this file")
    elif keyword == "RUN" and re.search(r"\bsudo\b", args):
        problem(instruction.line, "sudo in a RUN step")


# --- build steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    """What `build-steps` produced: the final stage as this machine can run it."""

    root: Path  # stands in for the image's /
    env: dict[str, str]  # environment for the final stage's processes (image paths mapped)
    image_env: dict[str, str]  # the final stage's ENV as the image has it
    entrypoint: list[str]
    cmd: list[str]
    healthcheck: list[str]
    user: str
    skipped: list[str]  # final-stage RUN steps not executed here

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")


def _host_env(python: Path, shim_dir: Path) -> dict[str, str]:
    """This machine's environment minus any active virtualenv; `python` is `shim_dir`'s link
    to the given interpreter."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "CONDA_PREFIX")
    }
    shim_dir.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        link = shim_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(python)
    kept = [
        d
        for d in env.get("PATH", os.defpath).split(os.pathsep)
        if d and not (Path(d).parent / "pyvenv.cfg").exists()
    ]
    env["PATH"] = os.pathsep.join([str(shim_dir), *kept])
    return env


def _map_image_paths(name: str, value: str, root: Path) -> str:
    """Image paths in an ENV value, under the scratch root (PATH-like values item by item)."""

    def one(item: str) -> str:
        return str(root / item.lstrip("/")) if item.startswith("/") else item

    if name.endswith("PATH"):
        return ":".join(one(item) for item in value.split(":"))
    return one(value)


def _copy(sources: Sequence[Path], context: Path, dest: Path, rules: IgnoreRules | None) -> None:
    """COPY semantics: files into a directory destination, a directory's contents into dest."""
    into_dir = len(sources) > 1 or str(dest).endswith("/")
    for source in sources:
        if not source.exists():
            raise DockerfileError(f"COPY: {source} does not exist in the context")
        if source.is_dir():
            for item in sorted(source.rglob("*")):
                rel = item.relative_to(context).as_posix()
                if item.is_dir() or (rules is not None and rules.ignored(rel)):
                    continue
                target = dest / item.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(item, target)
        else:
            rel = source.relative_to(context).as_posix()
            if rules is not None and rules.ignored(rel):
                raise DockerfileError(f"COPY: {rel} is excluded by the ignore file")
            target = dest / source.name if into_dir or dest.is_dir() else dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _in_image(root: Path, workdir: Path, path: str) -> Path:
    """An image path (absolute, or relative to WORKDIR) under the scratch root."""
    return root / path.lstrip("/") if path.startswith("/") else workdir / path


def _absolute_paths(command: str) -> list[str]:
    return [word for word in shlex.split(command) if word.startswith("/")]


def _log(line: str) -> None:
    print(line, flush=True)  # in order with the RUN steps' own output


def build_steps(
    dockerfile: Dockerfile,
    root: Path,
    *,
    context: Path | None = None,
    python: Path | None = None,
    log: Callable[[str], None] = _log,
) -> Image:
    """Run the Dockerfile's steps under `root` (see the module docstring); return the result."""
    context = (context or dockerfile.path.resolve().parent.parent).resolve()
    python = python or Path(getattr(sys, "_base_executable", sys.executable))
    for stage in dockerfile.stages:
        match = _PYTHON_IMAGE.search(stage.base)
        if stage.base in dockerfile.stage_names():
            continue
        if match is None:
            raise DockerfileError(f"{stage.base}: not a python:X.Y image; cannot stand in for it")
        wanted = (int(match.group(1)), int(match.group(2)))
        have = _python_version(python)
        if wanted != have:
            raise DockerfileError(
                f"the image's Python is {wanted[0]}.{wanted[1]}, {python} is "
                f"{have[0]}.{have[1]}: the same wheels would not be installed"
            )
    ignore = dockerfile.ignore_file()
    rules = IgnoreRules.read(ignore) if ignore.exists() else None
    root.mkdir(parents=True, exist_ok=True)
    # Where the python images keep their interpreter; a virtualenv made from it links to it.
    host = _host_env(python, root / "usr" / "local" / "bin")
    image: Image | None = None
    for index, stage in enumerate(dockerfile.stages):
        final = index == len(dockerfile.stages) - 1
        image = _run_stage(stage, dockerfile, root, context, host, rules, final=final, log=log)
    assert image is not None
    return image


def _python_version(python: Path) -> tuple[int, int]:
    out = subprocess.run(
        [str(python), "-c", "import sys; print(*sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), int(out[1])


def _run_stage(
    stage: Stage,
    dockerfile: Dockerfile,
    root: Path,
    context: Path,
    host: Mapping[str, str],
    rules: IgnoreRules | None,
    *,
    final: bool,
    log: Callable[[str], None],
) -> Image:
    env = dict(host)  # what RUN steps and the final stage's processes see, paths mapped
    image_env: dict[str, str] = {}  # the stage's ENV as the image has it
    build_args: dict[str, str] = {}  # ARGs: visible to RUN steps, not in the image
    workdir = root
    entrypoint: list[str] = []
    cmd: list[str] = []
    healthcheck: list[str] = []
    user = "0"
    skipped: list[str] = []
    names = dockerfile.stage_names()
    for instruction in stage.instructions:
        keyword, args = instruction.keyword, instruction.args
        where = f"{dockerfile.path.name}:{instruction.line}"
        if keyword == "ARG":
            name, default = arg_pair(args)
            if "=" not in args:  # re-declares a global ARG to use its value in this stage
                default = dockerfile.global_args.get(name, "")
            build_args[name] = expand(default, build_args | image_env)
            env[name] = build_args[name]
        elif keyword == "ENV":
            for name, raw in env_pairs(args):
                image_env[name] = expand(raw, build_args | image_env, keep_unknown=True)
                env[name] = expand(_map_image_paths(name, raw, root), env)
        elif keyword == "WORKDIR":
            workdir = _in_image(root, workdir, expand(args, build_args | image_env))
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            words = instruction.exec_form() or shlex.split(args)
            flags = {w.partition("=")[0]: w.partition("=")[2] for w in words if w.startswith("--")}
            paths = [expand(w, build_args | image_env) for w in words if not w.startswith("--")]
            *sources, dest_text = paths
            dest = _in_image(root, workdir, dest_text)
            if dest_text.endswith("/"):
                dest.mkdir(parents=True, exist_ok=True)
            if "--from" in flags:
                if flags["--from"] not in names:
                    raise DockerfileError(f"{where}: COPY --from={flags['--from']} is no stage")
                for source in sources:
                    src = root / source.lstrip("/")
                    if not src.exists():
                        raise DockerfileError(f"{where}: {source} was not built")
                    if src.resolve() != dest.resolve():  # the shared root already holds it
                        _copy([src], src.parent, dest, None)
                log(f"{where}: COPY {args}")
                continue
            _copy([context / s for s in sources], context, dest, rules)
            log(f"{where}: COPY {args}")
        elif keyword == "RUN":
            if final:
                skipped.append(args)
                log(f"{where}: (not run here) RUN {args}")
                continue
            argv = instruction.exec_form()
            if argv is None:
                absolute = _absolute_paths(args)
                if absolute:
                    raise DockerfileError(
                        f"{where}: RUN names image paths {absolute}; use variables or paths "
                        "relative to WORKDIR so the step runs outside the image too"
                    )
                argv = ["/bin/sh", "-c", args]
            log(f"{where}: RUN {args}")
            result = subprocess.run(argv, cwd=workdir, env=env, check=False)
            if result.returncode != 0:
                raise DockerfileError(f"{where}: RUN exited with {result.returncode}")
        elif keyword == "ENTRYPOINT":
            entrypoint = instruction.exec_form() or ["/bin/sh", "-c", args]
        elif keyword == "CMD":
            cmd = instruction.exec_form() or ["/bin/sh", "-c", args]
        elif keyword == "HEALTHCHECK":
            words = args.split()
            while words and words[0].startswith("--"):
                words.pop(0)
            if words[:1] == ["CMD"]:
                rest = args[args.index("CMD") + 3 :].strip()
                healthcheck = _json_array(rest) or ["/bin/sh", "-c", rest]
        elif keyword == "USER":
            user = expand(args, build_args | image_env)
    return Image(root, env, image_env, entrypoint, cmd, healthcheck, user, skipped)


# --- command line ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.dockerfile", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("lint", help="check the Dockerfile; exit 1 on any problem")
    check.add_argument("dockerfile", nargs="?", type=Path, default=DEFAULT_DOCKERFILE)
    steps = commands.add_parser("build-steps", help="run the build steps under a scratch root")
    steps.add_argument("dockerfile", nargs="?", type=Path, default=DEFAULT_DOCKERFILE)
    steps.add_argument("--root", type=Path, required=True, help="directory standing in for /")
    steps.add_argument("--python", type=Path, help="interpreter standing in for the image's")
    args = parser.parse_args(argv)
    try:
        dockerfile = parse(args.dockerfile)
        if args.command == "lint":
            problems = lint(dockerfile)
            for line in problems:
                print(line)
            print(f"{args.dockerfile}: {len(problems)} problem(s)")
            return 1 if problems else 0
        image = build_steps(dockerfile, args.root, python=args.python)
    except DockerfileError as exc:
        print(f"deploy.dockerfile: {exc}", file=sys.stderr)
        return 1
    entry = shutil.which(image.entrypoint[0], path=image.env["PATH"]) if image.entrypoint else None
    print(f"entry point: {entry} {' '.join(image.entrypoint[1:])} (as user {image.user})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
