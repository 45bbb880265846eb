"""Every core module has its tests where one looks: `tests/core/<stage>/test_<module>.py`.

A module tested elsewhere (through the module that drives it, or over HTTP) is listed in
`TESTED_ELSEWHERE` with the test files that cover it; the list may only shrink, so an entry
whose module gained its own test file, or whose test files are gone, fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import proxy.core

CORE = Path(proxy.core.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent.parent

# Generated code is tested through the encoders and decoders that use it.
GENERATED = frozenset({"wire/codec_pb2.py"})

TESTED_ELSEWHERE: dict[str, tuple[str, ...]] = {
    "errors.py": ("tests/server/test_validation.py", "tests/server/test_hardening.py"),
    "guard.py": ("tests/core/safety/test_policed_streams.py",),
    "compression/dict_samples.py": ("tests/test_dictionaries.py",),
    "compression/dictionaries.py": (
        "tests/test_dictionaries.py",
        "tests/core/compression/test_compressors.py",
    ),
    "maps/checks.py": ("tests/maps/test_map_checks.py",),
    "maps/content.py": ("tests/maps/test_map_checks.py", "tests/tokenizers/test_codec_maps.py"),
    "safety/descriptor.py": ("tests/server/test_safety.py", "tests/server/test_schema.py"),
    "safety/policy.py": ("tests/core/safety/test_policy_loading.py",),
    "safety/rules.py": (
        "tests/core/safety/test_matcher.py",
        "tests/core/safety/test_regex_scan.py",
    ),
    "safety/stream.py": (
        "tests/core/safety/test_policed_streams.py",
        "tests/core/safety/test_json_policing.py",
    ),
    "stream/token_bytes.py": ("tests/core/stream/test_backend_ids.py",),
    "stream/token_source.py": ("tests/core/stream/test_transcode_sources.py",),
    "stream/tool_calls.py": (
        "tests/core/stream/test_chunks.py",
        "tests/core/stream/test_transcode_sources.py",
    ),
    "stream/transcode.py": (
        "tests/core/stream/test_transcode_sources.py",
        "tests/core/safety/test_policed_streams.py",
    ),
    "wire/decoder.py": ("tests/core/wire/test_frames.py", "tests/server/test_codec_stream.py"),
    "wire/delta.py": ("tests/core/wire/test_frame_extensions.py",),
    "wire/protowire.py": ("tests/core/wire/test_codec_request.py",),
    "wire/schema.py": ("tests/server/test_schema.py",),
    "wire/tool_calls.py": ("tests/core/wire/test_frames.py", "tests/server/test_chat.py"),
}


def core_modules() -> list[str]:
    return sorted(
        str(path.relative_to(CORE))
        for path in CORE.rglob("*.py")
        if path.name != "__init__.py" and str(path.relative_to(CORE)) not in GENERATED
    )


def mirror(module: str) -> Path:
    path = Path(module)
    return TESTS / path.parent / f"test_{path.name}"


@pytest.mark.parametrize("module", core_modules())
def test_every_core_module_has_its_tests(module: str) -> None:
    if module in TESTED_ELSEWHERE:
        assert not mirror(module).exists(), f"{module} has its own tests now: drop its entry"
        for test_file in TESTED_ELSEWHERE[module]:
            assert (ROOT / test_file).is_file(), f"{module}: {test_file} is gone"
    else:
        assert mirror(module).is_file(), (
            f"{module} has no {mirror(module).relative_to(ROOT)}; write it, or list where "
            "it is tested in TESTED_ELSEWHERE"
        )


def test_the_allow_list_names_only_modules_that_exist() -> None:
    assert set(TESTED_ELSEWHERE) <= set(core_modules())
