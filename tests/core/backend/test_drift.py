"""Drift verdicts: probe results in, verdict (and its readiness check) out."""

from __future__ import annotations

from proxy.core.backend.drift import (
    KEPT_DIFFERENCES,
    DriftState,
    DriftVerdict,
    compare,
    drift_probes,
    pending,
)

TEXTS = ["Hello", "world", "1234"]


def test_identical_ids_match() -> None:
    ids = [[1], [2, 3], [4]]
    verdict = compare(
        TEXTS,
        ids,
        [list(x) for x in ids],
        proxy_vocab_size=10,
        backend_vocab_size=10,
        backend="llama.cpp",
    )
    assert verdict.state is DriftState.MATCHED
    assert (
        verdict.detail
        == "3 probe strings tokenize identically on the llama.cpp backend, vocab_size 10"
    )
    check = verdict.check()
    assert (check.name, check.ready, check.refuses_codec) == ("tokenizer", True, False)
    assert check.reason == "tokenizer_matches_backend"


def test_differences_are_named() -> None:
    verdict = compare(
        TEXTS,
        [[1], [2, 3], [4]],
        [[1], [2], [4, 5]],
        proxy_vocab_size=10,
        backend_vocab_size=None,
        backend="vLLM",
    )
    assert verdict.state is DriftState.MISMATCHED
    assert (verdict.probes, verdict.differing) == (3, 2)
    assert [d.describe() for d in verdict.differences] == [
        "'world': proxy [2, 3] backend [2]",
        "'1234': proxy [4] backend [4, 5]",
    ]
    assert "2 of 3 probe strings tokenize differently" in verdict.detail
    assert "vLLM" in verdict.detail
    check = verdict.check()
    assert (check.ready, check.refuses_codec, check.reason) == (False, True, "tokenizer_mismatch")


def test_a_vocab_size_difference_alone_is_a_mismatch() -> None:
    verdict = compare(
        TEXTS, [[1]] * 3, [[1]] * 3, proxy_vocab_size=10, backend_vocab_size=11, backend="x"
    )
    assert verdict.state is DriftState.MISMATCHED
    assert "vocab_size 10 here, 11 on the backend" in verdict.detail
    assert verdict.differences == ()


def test_only_some_differences_are_kept() -> None:
    texts = [str(i) for i in range(100)]
    verdict = compare(
        texts,
        [[i] for i in range(100)],
        [[i + 1] for i in range(100)],
        proxy_vocab_size=200,
        backend_vocab_size=None,
        backend="x",
    )
    assert verdict.differing == 100
    assert len(verdict.differences) == KEPT_DIFFERENCES


def test_probes_with_control_token_text_are_left_out() -> None:
    probes = ["plain", "<|im_end|> after", "x<s>y", "", "also plain"]
    assert drift_probes(probes, ["<|im_end|>", "<s>", ""]) == ("plain", "also plain")


def test_states_map_to_readiness() -> None:
    assert not pending("waiting").check().ready
    assert not pending("waiting").check().refuses_codec
    for state in (DriftState.UNSUPPORTED, DriftState.DISABLED):
        check = DriftVerdict(state, "d").check()
        assert check.ready
        assert not check.refuses_codec
