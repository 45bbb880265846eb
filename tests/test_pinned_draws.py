"""No test passes or fails by a draw: what the proxy draws at random is known, and held still.

tests/pinned_draws.py holds the drawn settings at 0 in the tests' settings and environment, and
the test server refuses a proxy app left drawing. Here: that check fails when it should, the
helpers pin what they say, and every module of the proxy that draws is accounted for, so that a
new draw (jitter, another sampled share) is pinned before a test can come to depend on it.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import proxy
from proxy import config
from proxy.server import create_app
from proxy.settings import Option, Settings
from proxy.tokenizers.vocabulary import Vocabulary
from tests import pinned_draws
from tests.conftest import ProxyTestServer

PACKAGE_DIR = Path(proxy.__file__).resolve().parent

# Each module of the proxy that draws at random, and why no test's outcome rests on its draw.
DRAWING_MODULES = {
    "proxy/server/models/verification.py": "verify_sample_rate, a drawn setting: pinned",
    "proxy/server/telemetry/record.py": "a request's id: only ever compared with itself",
    "proxy/core/http/json_body.py": "a marker in place of a token-ID run, never in a result",
    "proxy/sdk/transport.py": "a request's id when the server sent none: only ever shown",
    "proxy/dictionaries/train.py": "shuffled by random.Random(seed): the seed is an argument",
    "proxy/core/compression/dict_samples.py": "random.Random(seed): the seed is an argument",
}
# Where randomness comes from in Python's standard library.
RANDOM_SOURCES = frozenset({"random", "secrets", "uuid"})


def draws(path: Path) -> bool:
    """Whether the module imports a source of randomness, or calls `os.urandom`."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] in RANDOM_SOURCES for alias in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            RANDOM_SOURCES
        ):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "urandom":
            return True
    return False


def test_every_module_that_draws_is_accounted_for() -> None:
    drawing = {
        str(path.relative_to(PACKAGE_DIR.parent))
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if not path.name.endswith("_pb2.py") and draws(path)
    }
    assert drawing == set(DRAWING_MODULES), (
        "a module of the proxy draws at random: make what it draws a drawn setting "
        "(Option(drawn=True)) or a seed passed in, and say here why no test depends on it"
    )


def test_drawn_settings_are_shares() -> None:
    assert pinned_draws.DRAWN  # verify_sample_rate at least
    for field in dataclasses.fields(Settings):
        option = field.metadata.get("option", Option())
        if option.drawn:
            assert (option.minimum, option.maximum) == (0, 1), field.name


def test_the_helpers_pin_what_is_drawn_unless_a_test_asks(tmp_path: Path) -> None:
    given: dict[str, Any] = {"upstream": ("http://u",), "tokenizer": Path("t")}
    assert pinned_draws.left_to_chance(Settings(**given)) == ["verify_sample_rate=0.01"]
    assert pinned_draws.left_to_chance(pinned_draws.settings(**given)) == []
    assert pinned_draws.settings(**given, verify_sample_rate=1.0).verify_sample_rate == 1.0
    # A process's environment beats its file, on every reload too.
    file = tmp_path / "c.toml"
    file.write_text('upstream = "http://u"\ntokenizer = "t"\nverify_sample_rate = 0.5\n')
    loaded = config.load(file=file, env=pinned_draws.environment())
    assert pinned_draws.left_to_chance(loaded) == []


@pytest.mark.parametrize(
    ("rate", "refused"), [(0.01, True), (0.5, True), (0.0, False), (1.0, False)]
)
def test_a_test_server_refuses_an_app_that_draws(
    settings: Settings, smollm2_vocabulary: Vocabulary, rate: float, refused: bool
) -> None:
    app = create_app(dataclasses.replace(settings, verify_sample_rate=rate), smollm2_vocabulary)
    if refused:
        with pytest.raises(
            AssertionError, match=f"draws at random \\(verify_sample_rate={rate}\\)"
        ):
            ProxyTestServer(app)
    else:
        ProxyTestServer(app)


@pytest.fixture
def settings(smollm2_gguf: Path) -> Settings:
    return pinned_draws.settings(
        upstream=("http://127.0.0.1:1",), tokenizer=smollm2_gguf, drift_check=False
    )
