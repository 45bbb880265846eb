"""The probe strings are fit for comparing tokenizers through JSON APIs."""

from __future__ import annotations

import json

from proxy.tokenizers.probes import PROBE_STRINGS


def test_probes_are_many_and_unique() -> None:
    assert len(PROBE_STRINGS) >= 300
    assert len(set(PROBE_STRINGS)) == len(PROBE_STRINGS)


def test_probes_survive_json_and_utf8() -> None:
    for text in PROBE_STRINGS:
        assert "\x00" not in text
        assert json.loads(json.dumps(text)) == text
        assert text.encode("utf-8").decode("utf-8") == text  # no lone surrogates
