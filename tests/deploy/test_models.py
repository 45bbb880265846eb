"""Several models behind one proxy: the Helm chart's `models` value and the multi-model kustomize
overlay reach the proxy's config file as its `models` list, each model's tokenizer on a mount of
its own; and the chart refuses a list the proxy would refuse."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from proxy import cli, config
from proxy.settings import ModelSettings, Settings
from tests.deploy.rendering import (
    CHART,
    KUSTOMIZE,
    REPO,
    Doc,
    helm_template,
    mounted_file,
    proxy_pod,
)
from tests.deploy.test_helm import helm_fails

MULTI = ("kustomize/multi-model", "helm/multimodel")
CI_VALUES = CHART / "ci" / "multimodel-values.yaml"
# What both examples deploy: three models, the first the default.
NAMES = ["llama-3.1-8b", "qwen3-8b", "smollm2-360m"]


def config_file(docs: list[Doc], tmp_path: Path) -> Settings:
    """The rendered config file, taken from the ConfigMap mounted where the container's
    --config points, loaded by the proxy's own loader (nothing from the environment)."""
    pod = proxy_pod(docs)
    container = pod.container()
    args = cli.build_parser().parse_args(["serve", *container.get("args", [])])
    path = str(args.config)
    local = tmp_path / PurePosixPath(path).name
    local.write_text(mounted_file(docs, pod, container, path))
    return config.load(file=local, env={})


def ci_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(CI_VALUES.read_text())
    return values


def render(helm: Path, tmp_path: Path, values: dict[str, Any], *args: str) -> list[Doc]:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    return helm_template(helm, "-f", file, *args)


def refused(helm: Path, tmp_path: Path, values: dict[str, Any], *args: str) -> str:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    return helm_fails(helm, "-f", file, *args)


@pytest.mark.parametrize("name", MULTI)
def test_the_models_reach_the_config_file(
    name: str, renderings: dict[str, list[Doc]], tmp_path: Path
) -> None:
    settings = config_file(renderings[name], tmp_path)
    # A models list, and nothing of the single-model settings (the base's `tokenizer` is gone).
    assert settings.upstream == ()
    assert settings.tokenizer is None
    assert [m.name for m in settings.models] == NAMES
    models = {m.name: m for m in settings.model_list()}
    assert settings.model_list()[0].name == settings.default_model == "llama-3.1-8b"
    llama, qwen, smollm = (models[n] for n in NAMES)
    assert llama.names == ("llama-3.1-8b", "llama3")
    assert llama.upstreams == (
        "http://vllm-llama-0.vllm-llama.inference.svc.cluster.local:8000",
        "http://vllm-llama-1.vllm-llama.inference.svc.cluster.local:8000",
    )
    assert llama.upstream_model == "meta-llama/Llama-3.1-8B-Instruct"
    assert qwen.upstreams == ("http://vllm-qwen3.inference.svc.cluster.local:8000",)
    assert smollm.upstreams == ("http://llamacpp-smollm2.inference.svc.cluster.local:8080",)
    assert (llama.backend, qwen.backend, smollm.backend) == ("auto", "vllm", "llamacpp")
    # Readiness: the default model, and Qwen3 because it says so.
    assert (llama.required, qwen.required, smollm.required) == (True, True, False)
    assert smollm.drift_check_interval == 600
    assert llama.drift_check_interval == settings.drift_check_interval
    for model in models.values():
        assert model.tokenizer is not None
        assert PurePosixPath(f"/models/{model.name}") in {
            PurePosixPath(model.tokenizer),
            *PurePosixPath(model.tokenizer).parents,
        }


def test_helm_and_kustomize_deploy_the_same_models(
    renderings: dict[str, list[Doc]], tmp_path: Path
) -> None:
    helm, kustomize = (config_file(renderings[name], tmp_path) for name in reversed(MULTI))
    assert helm.models == kustomize.models
    assert helm.default_model == kustomize.default_model


@pytest.mark.parametrize("name", MULTI)
def test_each_tokenizer_is_on_its_own_mount(
    name: str, renderings: dict[str, list[Doc]], tmp_path: Path
) -> None:
    docs = renderings[name]
    settings = config_file(docs, tmp_path)
    pod = proxy_pod(docs)
    container = pod.container()
    claims = {}
    for model in settings.model_list():
        mount = pod.mount_for(container, str(model.tokenizer))
        assert mount is not None, model.name
        assert mount["mountPath"] == f"/models/{model.name}"
        assert mount["readOnly"] is True
        volume = pod.volume(mount["name"])
        claims[model.name] = (volume["persistentVolumeClaim"]["claimName"], mount.get("subPath"))
    # Llama on its own volume; the other two share one, each mounting only its directory.
    assert claims == {
        "llama-3.1-8b": ("llama-3.1-8b-files", None),
        "qwen3-8b": ("model-files", "qwen3-8b"),
        "smollm2-360m": ("model-files", "smollm2"),
    }


def test_the_deploy_docs_example_is_the_overlays_config(tmp_path: Path) -> None:
    """docs/DEPLOY.md's TOML example is a complete config file, the overlay's."""
    text = (REPO / "docs" / "DEPLOY.md").read_text()
    section = text.split("## Several models behind one proxy", 1)[1]
    (example,) = [b for b in re.findall(r"```toml\n(.*?)```", section, re.S) if "[[models]]" in b]
    file = tmp_path / "codec-proxy.toml"
    file.write_text(example)
    documented = config.load(file=file, env={})
    overlay = config.load(file=KUSTOMIZE / "overlays" / "multi-model" / "codec-proxy.toml", env={})
    assert documented == overlay


def test_single_model_defaults_are_values_yamls() -> None:
    """The template's copy of the single-model defaults (beside `models` they must stay so)."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(
        r'define "codec-proxy.singleModelDefaults" -}}\n(.*?)\{\{- end', helpers, re.S
    )
    assert match is not None
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    copied = yaml.safe_load(match.group(1))
    assert copied == {"upstream": values["upstream"], "tokenizer": values["tokenizer"]}


def one_model(tokenizer: dict[str, Any], **entry: Any) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": "m",
                "upstreams": ["http://m.inference.svc.cluster.local:8000"],
                "tokenizer": tokenizer,
                **entry,
            }
        ]
    }


@pytest.mark.parametrize(
    ("tokenizer", "path", "volume"),
    [
        ({"volume": {"persistentVolumeClaim": {"claimName": "m"}}}, "/models/m",
         "persistentVolumeClaim"),
        ({"volume": {"emptyDir": {}}, "path": "tok/tokenizer.json", "mountPath": "/t/"},
         "/t/tok/tokenizer.json", "emptyDir"),
        ({"source": "configMap", "configMap": {"name": "tok"}}, "/models/m/tokenizer.json",
         "configMap"),
        ({"source": "configMap", "configMap": {"name": "tok", "key": "m.json"}},
         "/models/m/m.json", "configMap"),
        ({"source": "image", "path": "/opt/tokenizers/m.gguf"}, "/opt/tokenizers/m.gguf", None),
    ],
)  # fmt: skip
def test_model_tokenizer_sources(
    helm: Path, tmp_path: Path, tokenizer: dict[str, Any], path: str, volume: str | None
) -> None:
    docs = render(helm, tmp_path, one_model(tokenizer))
    (model,) = config_file(docs, tmp_path).model_list()
    assert str(model.tokenizer) == path
    pod = proxy_pod(docs)
    mount = pod.mount_for(pod.container(), path)
    if volume is None:
        assert mount is None
        assert not any(v["name"].startswith("codec-proxy-tokenizer") for v in pod.spec["volumes"])
        return
    assert mount is not None
    assert mount["readOnly"] is True
    source = pod.volume(mount["name"])
    assert volume in source
    if volume == "configMap":
        (item,) = source["configMap"]["items"]
        assert item["key"] == item["path"] == PurePosixPath(path).name


def test_the_chart_writes_each_entry_as_given(helm: Path, tmp_path: Path) -> None:
    """Every key of an entry but `tokenizer` reaches the config file as it is in the values."""
    entry = {
        "aliases": ["a", "b"],
        "upstream_model": "org/m",
        "map_id": "m-map",
        "zstd_dicts": ["msgpack=/etc/codec-proxy/dictionaries/m.zstd"],
        "codec_enabled": False,
        "required": True,
        "token_ids": "backend",
        "backend": "sglang",
        "drift_check": False,
        "drift_check_interval": 60,
        "max_prompt_ids": 8192,
        "flush_interval_ms": 5,
        "flush_frames": 4,
        "max_streams": 64,
        "upstream_protocol": "json",
        "upstream_stream_format": "msgpack",
        "uncompressed": True,
    }
    assert set(entry) | {"name", "upstreams", "tokenizer"} == {
        f.name for f in dataclasses.fields(ModelSettings)
    }
    values = one_model({"source": "image", "path": "/m.json"}, **entry)
    (model,) = config_file(render(helm, tmp_path, values), tmp_path).models
    for key, value in entry.items():
        assert getattr(model, key) == (tuple(value) if isinstance(value, list) else value), key


def test_models_in_sidecar_mode(helm: Path, tmp_path: Path) -> None:
    """A pod with an engine per model: each tokenizer read from its engine's volume."""
    values = yaml.safe_load((CHART / "ci" / "sidecar-values.yaml").read_text())
    values["tokenizer"] = None
    values["models"] = [
        {"name": "m1", "upstreams": ["http://127.0.0.1:8000"],
         "tokenizer": {"existingVolume": "model"}},
        {"name": "m2", "upstreams": ["http://127.0.0.1:8001"],
         "tokenizer": {"existingVolume": "model", "subPath": "m2", "path": "tokenizer.json"}},
    ]  # fmt: skip
    docs = render(helm, tmp_path, values)
    settings = config_file(docs, tmp_path)
    pod = proxy_pod(docs)
    paths = ["/models/m1", "/models/m2/tokenizer.json"]
    for model, path in zip(settings.model_list(), paths, strict=True):
        assert str(model.tokenizer) == path
        mount = pod.mount_for(pod.container(), path)
        assert mount is not None
        assert mount["name"] == "model"
    # Sidecar mode's own upstream is the models' business now.
    assert settings.upstream == ()
    values["models"][1]["tokenizer"]["existingVolume"] = "weights"
    message = refused(helm, tmp_path, values)
    assert "models[1].tokenizer.existingVolume: the pod template has no volume weights" in message


def changed(change: Any) -> dict[str, Any]:
    values = copy.deepcopy(ci_values())
    change(values)
    return values


BAD = [
    (lambda v: v.update(upstream=["http://vllm.inference.svc.cluster.local:9000"]),
     "models and upstream are both set"),
    (lambda v: v.update(tokenizer={"path": "llama"}), "models and tokenizer are both set"),
    (lambda v: v.update(defaultModel="gpt-4"), "defaultModel: gpt-4 is no name of a listed model"),
    (lambda v: v["models"][1].update(aliases=["llama3"]),
     "models[1]: the name llama3 is taken by another model"),
    (lambda v: v["models"][2].update(name="qwen3-8b"),
     "models[2]: the name qwen3-8b is taken by another model"),
    (lambda v: v.update(config={"model": "llama"}), "config.model is per model"),
    (lambda v: v.update(config={"map_id": "llama"}), "config.map_id is per model"),
    (lambda v: v["models"][2].update(name="../etc"),
     'models[2].tokenizer.mountPath: the name "../etc" is no directory name'),
    (lambda v: v["models"][1]["tokenizer"].update(mountPath="/models/llama-3.1-8b"),
     "two tokenizers are mounted at /models/llama-3.1-8b"),
    (lambda v: v.update(extraVolumes=[]),
     "models[1].tokenizer.existingVolume: extraVolumes has no volume model-files"),
    (lambda v: v["models"][0]["tokenizer"].pop("volume"), "models[0].tokenizer.volume"),
    (lambda v: v["models"][0].update(tokenizer={"source": "image", "path": "llama.json"}),
     "models[0].tokenizer.path: an absolute path inside the image"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_models_are_refused(helm: Path, tmp_path: Path, change: Any, message: str) -> None:
    assert message in refused(helm, tmp_path, changed(change))


# What the schema refuses before a template runs (and the template, when it is skipped).
SCHEMA_BAD = [
    (lambda v: v["models"][0].pop("upstreams"), "upstreams", "models[0].upstreams"),
    (lambda v: v["models"][0].update(upstreams=[]), "upstreams", "models[0].upstreams"),
    (lambda v: v["models"][0].pop("tokenizer"), "tokenizer", "models[0].tokenizer"),
    (lambda v: v["models"][0].update(upstreams=["vllm:8000"]), "upstreams", None),
    (lambda v: v["models"][0].update(upstream=["http://a:1"]), "upstream", None),
    (lambda v: v["models"][0].update(max_prompt_ids=0), "max_prompt_ids", None),
    (lambda v: v["models"][0].update(token_ids="guess"), "token_ids", None),
    (lambda v: v["models"][2].update(tokenizer={"source": "configMap", "configMap": {}}),
     "name", "models[2].tokenizer.configMap.name"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message", "template_message"), SCHEMA_BAD)
def test_the_schema_refuses_bad_entries(
    helm: Path, tmp_path: Path, change: Any, message: str, template_message: str | None
) -> None:
    values = changed(change)
    assert message in refused(helm, tmp_path, values)
    if template_message is not None:
        assert template_message in refused(helm, tmp_path, values, "--skip-schema-validation")


def test_default_model_needs_models(helm: Path) -> None:
    assert "defaultModel needs a models list" in helm_fails(helm, "--set", "defaultModel=llama")


def test_the_single_model_values_may_be_null(helm: Path, tmp_path: Path) -> None:
    """Beside `models`, `upstream` and `tokenizer` left at their defaults or unset alike."""
    kept = helm_template(helm, "-f", CI_VALUES)
    assert kept == helm_template(helm, "-f", CI_VALUES, "--set", "upstream=null,tokenizer=null")
