"""What the proxy draws at random, held still for the tests.

A setting marked `drawn` (proxy/settings.py) is a share the proxy draws against per request:
`verify_sample_rate`, 0.01 by default, samples one Codec stream in a hundred, and a test that
asserts anything a sampled stream changes (its span's attributes, the verification metrics,
what the event loop schedules) then fails in about one run in a hundred. At 0 or 1 nothing is
drawn.

So the tests' settings hold every drawn setting at 0 unless a test asks for another value
(`settings`, `environment` for a `codec-proxy serve` process and its config files), and every
proxy app a test serves is checked (`check`, by the test server in tests/conftest.py): one left
between 0 and 1 fails the test that built it. A share in between is tested where the draw is
passed in (proxy/core/verify/sampling.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from proxy.config import ENV_PREFIX
from proxy.settings import Option, Settings

DRAWN: Final = tuple(
    field.name
    for field in dataclasses.fields(Settings)
    if field.metadata.get("option", Option()).drawn
)
PINNED: Final[dict[str, Any]] = dict.fromkeys(DRAWN, 0.0)


def settings(**given: Any) -> Settings:
    """`Settings(**given)`, with the drawn settings at 0 unless given."""
    return Settings(**{**PINNED, **given})


def environment() -> dict[str, str]:
    """The same for a process: its `CODEC_PROXY_*` variables, which beat its config file (and
    keep beating it when a reload reads the file again)."""
    return {ENV_PREFIX + name.upper(): "0" for name in DRAWN}


def left_to_chance(settings: Settings) -> list[str]:
    """The drawn settings that `settings` leave to a draw (strictly between 0 and 1)."""
    return [
        f"{name}={getattr(settings, name)}" for name in DRAWN if 0 < getattr(settings, name) < 1
    ]


def check(settings: Settings, what: str) -> None:
    """Fail the test when `settings` leave a share to chance."""
    drawn = left_to_chance(settings)
    if drawn:
        raise AssertionError(
            f"{what} draws at random ({', '.join(drawn)}): whether a request is sampled would "
            "decide the test. Pin it (tests/pinned_draws.py): 0, or 1 where the test samples"
        )
