"""Which configured model a request is for: by the name it gives, its aliases, or the default.

Routing happens before any upstream contact, so a name no model answers to costs no backend
anything: 404 `model_not_found` in OpenAI's error shape, which OpenAI clients already handle.
One model configured with `upstream`/`tokenizer` and no `model` name serves any name, as the
proxy did before it served several.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from proxy.core.errors import BadRequest, ConfigError, NotFound
from proxy.core.shown import quoted

# Metric and log values for requests that name no configured model (never the raw name: it is
# client input, and labels must stay a bounded set).
NO_MODEL: Final = "none"
UNKNOWN_MODEL: Final = "unknown"
# Names the model of a request whose body does not: Path B's `CodecRequest` has no model field
# (codec-spec.md §3.3), and the proxy reads a relayed body only if it is a JSON object.
MODEL_HEADER: Final = "Codec-Model"


@dataclass(frozen=True)
class ModelRoutes:
    """Every name clients may use, mapped to the model that answers to it."""

    names: Mapping[str, str]
    default: str
    any_name: bool = False

    @classmethod
    def build(
        cls, models: Iterable[tuple[str, Iterable[str]]], *, any_name: bool = False
    ) -> ModelRoutes:
        """From (model, names it answers to) pairs, the default model first."""
        names: dict[str, str] = {}
        default: str | None = None
        for model, aliases in models:
            default = default or model
            for name in aliases:
                if names.setdefault(name, model) != model:
                    raise ConfigError(
                        f"model {model!r}: the name {name!r} is also {names[name]!r}'s"
                    )
        if default is None:
            raise ConfigError("no model is configured")
        return cls(names, default, any_name)

    @property
    def several(self) -> bool:
        return len(set(self.names.values())) > 1

    def route(self, requested: object, *, unread_body: bool = False) -> str:
        """The model for a request's `model` value (None: it names none).

        `unread_body`: the request has a body the proxy could not read for a model (a relayed
        body that is not a JSON object). With several models, going to the default would be a
        guess that sends it to another model's backend: it is refused unless it names one.
        """
        if requested is None and unread_body and self.several:
            raise BadRequest(
                "several models are served here and this body could not be read for its "
                "`model` (it is not a JSON object, or its content coding cannot be undone): "
                f"name the model in the {MODEL_HEADER} request header",
                code="model_required",
                param="model",
            )
        if requested is None or self.any_name:
            return self.default
        if not isinstance(requested, str):
            raise BadRequest("model must be a string", code="invalid_type", param="model")
        model = self.names.get(requested)
        if model is None:
            raise NotFound(
                f"The model {quoted(requested)} does not exist (GET /v1/models lists the models "
                "served here)",
                code="model_not_found",
                param="model",
                public=True,
            )
        return model

    def label(self, requested: object) -> str:
        """The bounded metric value for `requested`: its model, or `unknown`."""
        try:
            return self.route(requested)
        except BadRequest:
            return UNKNOWN_MODEL
