"""Readiness: named checks, each owned by one part of the proxy, and the verdict over them.

`GET /readyz` reports it. A check can also refuse Codec mode, and that is a separate word from
`ready`: the tokenizer drift check refuses Codec and is not ready (the backend serves another
tokenizer, which no request can cause), while a refusal that requests can bring about (too
many verification mismatches) refuses Codec and stays ready, so that it never takes the pod
out of a Service and JSON with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    """The latest word of one check. `reason` is a stable code, the only word `/readyz` shows
    (it is open without a key); `detail` is a line for the operator's log, and may name
    upstream URLs and errors."""

    name: str
    ready: bool
    reason: str
    detail: str = ""
    refuses_codec: bool = False

    def to_json(self) -> dict[str, Any]:
        if self.refuses_codec:
            return {"ready": self.ready, "reason": self.reason, "refuses_codec": True}
        return {"ready": self.ready, "reason": self.reason}


class Readiness:
    """Every check's latest result. Owners replace their check whole; readers see snapshots."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def update(self, check: Check) -> None:
        self._checks[check.name] = check

    def discard(self, name: str) -> None:
        """Forget a check that only exists while something is wrong (a verification refusal)."""
        self._checks.pop(name, None)

    def get(self, name: str) -> Check | None:
        return self._checks.get(name)

    @property
    def ready(self) -> bool:
        return all(check.ready for check in self._checks.values())

    def codec_refusal(self) -> Check | None:
        """The first check that refuses Codec mode right now, if any."""
        return next((c for c in self._checks.values() if c.refuses_codec), None)

    def report(self) -> dict[str, Any]:
        """The `/readyz` body: status, what blocks readiness, and every check."""
        failing = [check for check in self._checks.values() if not check.ready]
        return {
            "status": "ready" if not failing else "not_ready",
            "reasons": [{"check": c.name, "reason": c.reason} for c in failing],
            "checks": {check.name: check.to_json() for check in self._checks.values()},
        }
