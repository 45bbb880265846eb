"""Readiness: named checks, replaced whole; ready only when all are; Codec refusals."""

from __future__ import annotations

from proxy.core.backend.readiness import Check, Readiness


def test_no_checks_is_ready() -> None:
    readiness = Readiness()
    assert readiness.ready
    assert readiness.report() == {"status": "ready", "reasons": [], "checks": {}}
    assert readiness.codec_refusal() is None


def test_a_failing_check_is_reported_and_replaced_whole() -> None:
    readiness = Readiness()
    readiness.update(Check("tokenizer", ready=True, reason="ok"))
    readiness.update(Check("other", ready=True, reason="fine"))
    assert readiness.report()["status"] == "ready"
    bad = Check(
        "tokenizer", ready=False, reason="tokenizer_mismatch", detail="d", refuses_codec=True
    )
    readiness.update(bad)
    assert not readiness.ready
    assert readiness.get("tokenizer") == bad
    assert readiness.codec_refusal() == bad
    assert readiness.report() == {
        "status": "not_ready",
        "reasons": [{"check": "tokenizer", "reason": "tokenizer_mismatch"}],
        "checks": {
            "tokenizer": {"ready": False, "reason": "tokenizer_mismatch", "refuses_codec": True},
            "other": {"ready": True, "reason": "fine"},
        },
    }


def test_not_ready_without_refusing_codec() -> None:
    readiness = Readiness()
    readiness.update(Check("tokenizer", ready=False, reason="drift_check_pending"))
    assert not readiness.ready
    assert readiness.codec_refusal() is None


def test_refusing_codec_while_ready() -> None:
    """What requests can bring about refuses Codec without blocking readiness."""
    readiness = Readiness()
    refusal = Check("verification", ready=True, reason="verification_mismatch", refuses_codec=True)
    readiness.update(refusal)
    assert readiness.ready
    assert readiness.codec_refusal() == refusal
    assert readiness.report() == {
        "status": "ready",
        "reasons": [],
        "checks": {
            "verification": {
                "ready": True,
                "reason": "verification_mismatch",
                "refuses_codec": True,
            }
        },
    }
