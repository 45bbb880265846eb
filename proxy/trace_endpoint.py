"""Where traces are exported, if anywhere: the `otlp_traces_endpoint` setting, else the standard
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` (pure: the variables are
passed in). Checked before the tokenizers load and before the workers start
(`proxy.cli._checked`), so that a variable the proxy cannot follow stops it once instead of
failing every worker it restarts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from proxy.core.errors import ConfigError
from proxy.core.shown import without_credentials

# Where OTLP/HTTP receivers take traces, below a collector's base URL (the OTLP specification).
TRACES_PATH: Final = "/v1/traces"
# The only exporter protocol shipped: the gRPC one needs grpcio, a large native dependency.
_PROTOCOL = "http/protobuf"


@dataclass(frozen=True)
class TraceEndpoint:
    url: str  # the OTLP/HTTP traces URL


def trace_endpoint(
    configured: str | None, environ: Mapping[str, str] = os.environ
) -> TraceEndpoint | None:
    """Whether traces are exported, and where (None: off). `ConfigError` for what the SDK
    would only log and ignore: an exporter or protocol this proxy does not ship."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter == "none":
        return None
    if configured:
        endpoint = configured
        # A collector's base URL, as most people write it, is not where it takes traces.
        if urlsplit(configured).path in ("", "/"):
            endpoint = configured.rstrip("/") + TRACES_PATH
    elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        endpoint = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + TRACES_PATH
    else:
        return None
    if exporter != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={exporter!r}: only 'otlp' or 'none' is supported")
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or _PROTOCOL
    ).strip()
    if protocol != _PROTOCOL:
        raise ConfigError(
            f"OTLP protocol {protocol!r}: traces are exported over OTLP/HTTP only "
            f"({_PROTOCOL}; a collector takes it on port 4318)"
        )
    if not endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            f"OTLP traces endpoint {without_credentials(repr(endpoint))}: not an http(s) URL"
        )
    return TraceEndpoint(endpoint)
