"""helm and kubectl (fetched like every other test asset) and the renderings they produce.

A tool that cannot be fetched fails the tests that need it: nothing here is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy import tools
from tests.deploy.rendering import TARGETS, Doc, Target


@pytest.fixture(scope="session")
def kubectl() -> Path:
    return tools.ensure(tools.KUBECTL)


@pytest.fixture(scope="session")
def helm() -> Path:
    return tools.ensure(tools.HELM)


@pytest.fixture(scope="session")
def helm3() -> Path:
    return tools.ensure(tools.HELM3)


@pytest.fixture(scope="session")
def renderings(kubectl: Path, helm: Path) -> dict[str, list[Doc]]:
    """Every target of rendering.TARGETS, rendered once per test session."""
    return {target.name: target.render(kubectl, helm) for target in TARGETS}


@pytest.fixture(params=TARGETS, ids=[t.name for t in TARGETS])
def target(request: pytest.FixtureRequest) -> Target:
    result: Target = request.param
    return result


@pytest.fixture
def docs(target: Target, renderings: dict[str, list[Doc]]) -> list[Doc]:
    return renderings[target.name]
