"""Tokenizer drift: does the backend tokenize exactly as the proxy does? Probe results in,
verdict out.

The proxy retokenizes the backend's text with its own copy of the model's tokenizer; if that
copy is not the backend's (another model loaded behind the same URL, a wrong file configured),
every Codec stream would carry wrong IDs and no client could tell. So both sides encode the
same probe strings (`proxy.tokenizers.probes`, a few hundred texts covering every branch of a
pre-tokenizer) and any difference refuses Codec mode (codec-spec.md §10: never advertise a map
the IDs do not follow).

Probes that contain a control token's text are left out: vLLM's `/tokenize` always parses
control tokens in its input, llama.cpp's only on request, and the proxy never does (generated
text is text), so those probes would differ by design, not by drift.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from proxy.core.backend.readiness import Check

CHECK_NAME = "tokenizer"
# How many differing probes a verdict keeps for the log and /readyz.
KEPT_DIFFERENCES = 20


class DriftState(StrEnum):
    PENDING = "pending"  # no conclusive check yet
    MATCHED = "matched"
    MISMATCHED = "mismatched"
    UNSUPPORTED = "unsupported"  # the backend has no usable /tokenize: nothing to compare
    DISABLED = "disabled"  # --drift-check off


# Readiness reason codes, one per state.
REASONS = {
    DriftState.PENDING: "drift_check_pending",
    DriftState.MATCHED: "tokenizer_matches_backend",
    DriftState.MISMATCHED: "tokenizer_mismatch",
    DriftState.UNSUPPORTED: "backend_has_no_tokenize",
    DriftState.DISABLED: "drift_check_disabled",
}


@dataclass(frozen=True)
class ProbeDifference:
    text: str
    proxy_ids: tuple[int, ...]
    backend_ids: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.text!r}: proxy {list(self.proxy_ids)} backend {list(self.backend_ids)}"


@dataclass(frozen=True)
class DriftVerdict:
    state: DriftState
    detail: str
    probes: int = 0
    differing: int = 0
    differences: tuple[ProbeDifference, ...] = ()

    def check(self) -> Check:
        """This verdict as the readiness check; only a confirmed mismatch refuses Codec."""
        return Check(
            name=CHECK_NAME,
            ready=self.state not in (DriftState.PENDING, DriftState.MISMATCHED),
            reason=REASONS[self.state],
            detail=self.detail,
            refuses_codec=self.state is DriftState.MISMATCHED,
        )


def drift_probes(probes: Iterable[str], control_tokens: Iterable[str]) -> tuple[str, ...]:
    """The probes both sides tokenize the same way when their tokenizers are the same."""
    controls = [token for token in control_tokens if token]
    return tuple(p for p in probes if p and not any(token in p for token in controls))


def pending(detail: str) -> DriftVerdict:
    return DriftVerdict(DriftState.PENDING, detail)


def compare(
    texts: Sequence[str],
    proxy_ids: Sequence[Sequence[int]],
    backend_ids: Sequence[Sequence[int]],
    *,
    proxy_vocab_size: int,
    backend_vocab_size: int | None,
    backend: str,
) -> DriftVerdict:
    """The verdict on one round of probes, encoded by the proxy and by the backend."""
    differences = [
        ProbeDifference(text, tuple(ours), tuple(theirs))
        for text, ours, theirs in zip(texts, proxy_ids, backend_ids, strict=True)
        if list(ours) != list(theirs)
    ]
    problems = []
    if backend_vocab_size is not None and backend_vocab_size != proxy_vocab_size:
        problems.append(f"vocab_size {proxy_vocab_size} here, {backend_vocab_size} on the backend")
    if differences:
        problems.append(f"{len(differences)} of {len(texts)} probe strings tokenize differently")
    if problems:
        detail = (
            f"the proxy's tokenizer does not match the {backend} backend's: "
            + "; ".join(problems)
            + ". Codec streams are refused (their IDs would be wrong); JSON passes through"
        )
        return DriftVerdict(
            DriftState.MISMATCHED,
            detail,
            probes=len(texts),
            differing=len(differences),
            differences=tuple(differences[:KEPT_DIFFERENCES]),
        )
    sizes = f", vocab_size {proxy_vocab_size}" if backend_vocab_size is not None else ""
    return DriftVerdict(
        DriftState.MATCHED,
        f"{len(texts)} probe strings tokenize identically on the {backend} backend{sizes}",
        probes=len(texts),
    )
