"""Runtime settings: one frozen value, built by `proxy.config` and handed to the app factory.

Each field is a setting: its name is the config-file key, `CODEC_PROXY_<NAME>` its environment
variable and `--<name>` its flag (see `proxy/config.py`). `Option` metadata holds the help
text and the bounds that are checked at start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from proxy.core.backend.balancer import DEFAULT_MAX_EJECTION_PERCENT, DEFAULT_PANIC_THRESHOLD
from proxy.core.backend.kind import BackendSetting
from proxy.core.errors import ConfigError
from proxy.core.http.upgrade import VersionPolicyMode
from proxy.core.shown import without_credentials
from proxy.core.stream.token_source import TokenIdMode

MiB = 1 << 20
# The longest token-ID prompt when neither `max_prompt_ids` nor the backend's /v1/models says:
# 128 Ki, the context of today's long-context open models (Llama 3.1, Qwen2.5 with YaRN).
DEFAULT_MAX_PROMPT_IDS = 131072
# What the reference engines put in their 426 bodies (interop.md §2.4).
DEFAULT_DOCS_URL = "https://codecai.net/docs/version-negotiation/"
# The trained dictionaries shipped with the proxy (dictionaries/manifest.json).
DEFAULT_DICTIONARIES_MANIFEST = (
    Path(__file__).resolve().parent.parent / "dictionaries" / "manifest.json"
)


@dataclass(frozen=True)
class Option:
    """How a setting is presented and checked."""

    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    secret: bool = False  # never logged, printed or exported
    url: bool = False  # values must be http(s) URLs
    flag: str | None = None  # flag name when it differs from the field name
    # Shown commented out in the example config instead of a default that depends on the
    # machine (a path inside the checkout).
    example: str | None = None
    # A share (0 to 1) the proxy draws against at random, per request: only 0 and 1 decide
    # without a draw (the tests hold such settings there: tests/pinned_draws.py).
    drawn: bool = False


def option(default: Any = dataclasses.MISSING, help: str = "", **checks: Any) -> Any:
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={"option": Option(help, **checks)})
    return dataclasses.field(default=default, metadata={"option": Option(help, **checks)})


# What the upstream speaks (docs/DEPLOY.md "Codec on the long hop"): `json`, an OpenAI server
# whose JSON-SSE the proxy turns into Codec; `codec`, a Codec server (another codec-proxy, an
# engine that speaks Codec) whose frames the proxy turns back into JSON for its clients.
UpstreamProtocol = Literal["json", "codec"]
# The frame formats the proxy asks a Codec upstream for (both render the same; protobuf is the
# smaller on the wire, docs/ENDPOINTS.md).
UpstreamStreamFormat = Literal["protobuf", "msgpack"]
CODEC: Final = "codec"


# The name a model goes by when it is configured with `upstream`/`tokenizer` and no `model`:
# in metrics and logs only, since such a model serves any name a request gives.
UNNAMED_MODEL = "default"


@dataclass(frozen=True)
class ModelSettings:
    """One model behind the proxy: its upstreams, its tokenizer, and what it overrides.

    An entry of the config file's `models` list; the keys left unset (None) take the
    top-level setting of the same name. `upstream`/`tokenizer`/`model` mean a list of one.
    """

    name: str = option(help="the model's name as clients send it in `model`")
    upstreams: tuple[str, ...] = option(
        help="its backend base URLs (balanced, health-checked, retried as `upstream`)", url=True
    )
    # Not with upstream_protocol = "codec": the upstream's published map is the tokenizer.
    tokenizer: Path | None = option(
        None,
        help="its tokenizer: a GGUF file, a tokenizer.json, a directory or a map "
        "(required unless its upstream_protocol is codec)",
    )
    aliases: tuple[str, ...] = option((), help="other names clients may use for it")
    # vLLM serves the names given by --served-model-name and 404s others; an alias the
    # backend does not know must be renamed on its way up.
    upstream_model: str | None = option(
        None, help="the name sent upstream in place of the client's (default: as sent)"
    )
    map_id: str | None = option(None, help="id of its published tokenizer map")
    zstd_dicts: tuple[str, ...] = option(
        (), help="its zstd dictionaries, FORMAT=PATH (msgpack or protobuf)"
    )
    codec_enabled: bool = option(True, help="serve Codec for this model (JSON always passes)")
    # The process is ready when every required model is; default: the default model only, so
    # one model's backend being down never takes the others out of a Service.
    required: bool | None = option(
        None, help="/readyz waits for this model (default: only the default model)"
    )
    token_ids: TokenIdMode | None = option(None, help="overrides `token_ids`")
    backend: BackendSetting | None = option(None, help="overrides `backend`")
    drift_check: bool | None = option(None, help="overrides `drift_check`")
    drift_check_interval: float | None = option(
        None, help="overrides `drift_check_interval`", minimum=1
    )
    max_prompt_ids: int | None = option(None, help="overrides `max_prompt_ids`", minimum=1)
    flush_interval_ms: float | None = option(None, help="overrides `flush_interval_ms`", minimum=0)
    flush_frames: int | None = option(None, help="overrides `flush_frames`", minimum=0)
    max_streams: int | None = option(
        None,
        help="its share of `max_streams`, 503 beyond (default: half of it with several models)",
        minimum=1,
    )
    upstream_protocol: UpstreamProtocol | None = option(None, help="overrides `upstream_protocol`")
    upstream_stream_format: UpstreamStreamFormat | None = option(
        None, help="overrides `upstream_stream_format`"
    )
    uncompressed: bool | None = option(None, help="overrides `uncompressed`")

    def __post_init__(self) -> None:
        tokenizer: object = self.tokenizer
        if isinstance(tokenizer, str):
            object.__setattr__(self, "tokenizer", Path(tokenizer))
        upstreams: object = self.upstreams
        if isinstance(upstreams, str):
            object.__setattr__(self, "upstreams", (upstreams,))
        if not self.upstreams:
            raise ValueError(f"model {self.name!r}: 'upstreams' needs at least one URL")

    @property
    def names(self) -> tuple[str, ...]:
        """Every name this model answers to, its own first."""
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class ModelConfig:
    """One model as served: its entry with every inherited key resolved (`Settings.model_list`)."""

    name: str
    names: tuple[str, ...]
    upstreams: tuple[str, ...]
    tokenizer: Path | None  # None: a Codec upstream, whose published map is the tokenizer
    # The name the upstream knows the model by, sent in place of the client's.
    upstream_model: str | None
    # What a request that names no model is sent upstream with (None: the upstream's only one).
    request_default: str | None
    map_id: str | None
    zstd_dicts: tuple[str, ...]
    codec_enabled: bool
    required: bool
    token_ids: TokenIdMode
    backend: BackendSetting
    drift_check: bool
    drift_check_interval: float
    max_prompt_ids: int | None
    flush_interval_ms: float
    flush_frames: int
    # Its share of the process's `max_streams` (which still holds for every model together).
    max_streams: int
    upstream_protocol: UpstreamProtocol = "json"
    upstream_stream_format: UpstreamStreamFormat = "protobuf"
    # Its responses go uncompressed whatever a client accepts (core/http/uncompressed.py).
    uncompressed: bool = False
    # `upstream`/`tokenizer`: any name a request gives is this model, as before there were
    # several (a `models` list routes by name).
    any_name: bool = False
    is_default: bool = False


@dataclass(frozen=True)
class Settings:
    # --- where ---
    # One model: `upstream` + `tokenizer` (+ `model`). Several: the `models` list instead.
    upstream: tuple[str, ...] = option(
        (),
        help="backend base URL; repeat for several (least-outstanding-requests balancing)",
        url=True,
    )
    tokenizer: Path | None = option(
        None,
        help="the backend model's tokenizer: a GGUF file, a tokenizer.json, or its directory "
        "(required unless upstream_protocol is codec)",
    )
    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(8080, help="port to listen on", minimum=0, maximum=65535)
    # An endpoint picker (Gateway API Inference Extension, llm-d) scrapes the model server's
    # metrics at the port it routes to, which a sidecar proxy holds: with an admin port the
    # serving port relays /metrics and the probes' paths to the backend like any other route
    # (docs/DEPLOY.md, "Behind an endpoint picker").
    admin_port: int | None = option(
        None,
        help="serve /livez, /readyz and the proxy's /metrics on this port (same host) instead; "
        "the serving port then relays those paths to the backend",
        minimum=1,
        maximum=65535,
    )
    # Only a default, as it always was: one model by `upstream` serves any name, relays the
    # backend's /v1/models, and passes JSON on as sent (a `models` list routes by name).
    model: str | None = option(
        None,
        help="with upstream/tokenizer: the model name Codec requests that name none are sent "
        "with (unset: the backend's only model)",
    )
    # Several models behind one proxy (docs/DEPLOY.md "Several models"): config file only.
    models: tuple[ModelSettings, ...] = option(
        (), help="the models served, each with its own upstreams and tokenizer (config file only)"
    )
    default_model: str | None = option(
        None,
        help="with models: the model for requests that name none (default: the first listed)",
    )

    # The two-proxy recipe: the hop between the proxies carries Codec, each end speaks JSON to
    # its side (docs/DEPLOY.md "Codec on the long hop").
    upstream_protocol: UpstreamProtocol = option(
        "json",
        help="what the upstream speaks: json (an OpenAI server; Codec clients get frames made "
        "from its JSON) or codec (a Codec server; JSON clients get JSON rendered from its "
        "frames, and no tokenizer is needed)",
    )
    upstream_stream_format: UpstreamStreamFormat = option(
        "protobuf", help="with upstream_protocol = codec: the frame format asked of the upstream"
    )

    # --- limits ---
    max_body_bytes: int = option(
        32 * MiB, help="largest request body, after decompression (413 beyond)", minimum=1
    )
    # Counted before a prompt's IDs are parsed or checked, so a body of millions of IDs costs
    # the proxy next to nothing (Path A token-ID prompts, Path B prompt_ids).
    max_prompt_ids: int | None = option(
        None,
        help="longest token-ID prompt, 413 beyond (default: the backend's context length from "
        f"/v1/models, else {DEFAULT_MAX_PROMPT_IDS})",
        minimum=1,
    )
    max_event_bytes: int = option(
        1 * MiB, help="largest single SSE event from the upstream (a bounded parser)", minimum=64
    )
    max_streams: int = option(
        1024,
        help="concurrent upstream requests per worker, all models together; beyond it 503 + "
        "Retry-After",
        minimum=1,
    )

    # --- timeouts (seconds; 0 disables). No total timeout: long generations are not failures.
    connect_timeout: float = option(5.0, help="TCP connect to an upstream", minimum=0)
    ttft_timeout: float = option(
        300.0,
        help="from request to the upstream's first body byte (prefill can be slow)",
        minimum=0,
    )
    idle_timeout: float = option(
        60.0, help="longest silence between two upstream chunks mid-stream", minimum=0
    )
    write_timeout: float = option(
        30.0, help="longest a client may stall our writes before it is dropped", minimum=0
    )
    drain_timeout: float = option(
        30.0, help="on SIGTERM, how long in-flight streams may finish", minimum=0
    )
    # Bounds what a client holds while it sends nothing useful (slowloris): a request head must
    # be complete this long after the connection opened or after its first byte, and a body
    # this long after its head. nginx's client_header_timeout and client_body_timeout: 60 s.
    request_timeout: float = option(
        30.0,
        help="reading a request's headers, and then its body, must finish within this (408)",
        minimum=0,
    )
    # Above every front proxy's own idle timeout for its upstream connections (Envoy 1 h,
    # ingress-nginx 60 s), so none ever reuses a connection the proxy is closing. aiohttp's
    # default, for that reason. Lower it when clients connect directly (nginx uses 75 s).
    client_keepalive_timeout: float = option(
        3630.0,
        help="a client connection idle between requests is closed after this (0: no keep-alive)",
        minimum=0,
    )

    # --- upstream pool ---
    # Explicit pool limits: aiohttp's silent default of 100 queues request 101 (peers.md A1).
    pool_limit: int = option(1024, help="upstream connections per worker, all hosts", minimum=1)
    pool_limit_per_host: int = option(
        0, help="upstream connections per host (0: no cap)", minimum=0
    )
    # Shorter than uvicorn's 5 s idle close, so we never reuse a connection it is closing (A8).
    keepalive_timeout: float = option(
        4.0,
        help="idle upstream connections are closed after this (0: a connection per request)",
        minimum=0,
    )
    # An upstream that read a request and closed without answering may have run it, or died of
    # it (a query of death): by default it goes nowhere else, as nginx does with non-idempotent
    # requests unless `proxy_next_upstream non_idempotent` (docs/DEPLOY.md "Retries").
    resend_unanswered_requests: bool = option(
        False,
        help="send a request that an upstream read and closed unanswered to the next upstream "
        "(each may run it; off: a 502)",
    )
    health_path: str = option("/health", help="upstream path polled for readiness")
    health_interval: float = option(5.0, help="seconds between active health checks", minimum=0.1)
    # Passive ejection counts only what says the upstream is unwell, never what a request
    # caused (500, 501, 4xx), and is capped like Envoy's outlier detection
    # (proxy/core/backend/balancer.py).
    eject_after: int = option(
        3,
        help="consecutive failures that eject an upstream (connect, timeout, a close without an "
        "answer, a bad head, 502/503/504)",
        minimum=1,
    )
    eject_seconds: float = option(
        10.0, help="how long an ejected upstream sits out before it is tried again", minimum=0
    )
    max_ejection_percent: int = option(
        DEFAULT_MAX_EJECTION_PERCENT,
        help="most upstreams ejected at once, in percent of all (never the last one in rotation)",
        minimum=0,
        maximum=100,
    )
    panic_threshold: int = option(
        DEFAULT_PANIC_THRESHOLD,
        help="below this percent of upstreams in rotation, ejected ones take requests again",
        minimum=0,
        maximum=100,
    )

    # --- access ---
    api_key: tuple[str, ...] = option(
        (), help="local API key clients must send as 'Authorization: Bearer <key>'", secret=True
    )
    api_key_file: Path | None = option(
        None,
        help="file with one local API key per line (# comments; no key at all is an error)",
        secret=True,
    )
    # With local keys, a client's Authorization header carries the proxy's key: by default it
    # stays here, so the backend never learns it (docs/ENDPOINTS.md, "Access, errors ...").
    forward_authorization: bool = option(
        False, help="with api_key set, still send the client's Authorization header upstream"
    )

    # --- Codec discovery and the vocab handshake (docs/TOKENIZER_MAPS.md) ---
    map_id: str | None = option(
        None,
        help="id of the published tokenizer map (default: a map's own id, else the file name)",
    )
    public_url: str | None = option(
        None,
        help="this proxy's public origin (https://host[:port]) for the URLs in index.json; "
        "unset, they follow each request's Host and the index is not shared-cacheable",
        url=True,
    )
    drift_check: bool = option(
        True, help="compare the tokenizer with the backend's /tokenize; a mismatch refuses Codec"
    )
    drift_check_interval: float = option(
        300.0, help="seconds between drift checks after the one at start", minimum=1
    )
    # Retokenizing cannot recover a non-canonical split or an unrendered end-of-turn token; the
    # backend's sampled IDs can (proxy/core/stream/token_source.py, docs/ENDPOINTS.md).
    token_ids: TokenIdMode = option(
        "auto",
        help="where frame IDs come from: auto (backend's when it sends them), backend, retokenize",
    )
    # Each server reports sampled IDs in its own field; asking for another's is work and
    # upstream bytes for nothing (proxy/core/backend/kind.py, docs/ENDPOINTS.md "Token IDs").
    backend: BackendSetting = option(
        "auto",
        help="the server behind the upstream, which decides the field that asks it for token IDs: "
        "auto (from its /v1/models; every backend's field until known), vllm, llamacpp, sglang",
    )

    # --- version negotiation and the safety policy (docs/VERSIONING_AND_SAFETY.md) ---
    # Both off by default: nothing enforced, no 426 ever sent, JSON passes through untouched.
    safety_policy: Path | None = option(
        None, help="safety policy file (public descriptor + private rules); enables the policy"
    )
    enforce_safety_policy: bool = option(
        False, help="answer Codec clients below 0.4 with 426 (needs safety_policy)"
    )
    version_policy: VersionPolicyMode = option(
        "off", help="off; advisory: log clients below 0.4; strict: 426 below 0.4"
    )
    deployment_id: str | None = option(None, help="named in 426 bodies and the version policy")
    # The reference engines always name one; clients show it to the user who must upgrade.
    docs_url: str | None = option(
        DEFAULT_DOCS_URL,
        help="upgrade documentation URL in 426 bodies and the version policy ('none': omit)",
    )

    # --- compressed Codec streams (docs/COMPRESSION.md: defaults measured there) ---
    # The first frame is always flushed at once; later ones wait at most this long.
    flush_interval_ms: float = option(
        50.0,
        help="compressed streams: longest a frame waits for its flush (0: flush every frame)",
        minimum=0,
    )
    flush_frames: int = option(
        32,
        help="compressed streams: flush once this many frames are pending (0: every frame)",
        minimum=0,
    )
    merge_frames: bool = option(
        True, help="compressed streams: send the frames of one flush window as one frame"
    )
    # zstd only with a dictionary (codec-spec.md §5). The manifest's are loaded at start and
    # their sha256 verified; `zstd_dicts` entries replace the manifest's for their format.
    dictionaries_manifest: Path | None = option(
        DEFAULT_DICTIONARIES_MANIFEST,
        help="manifest of trained zstd dictionaries ('none': none; default: the shipped one)",
        example='"/etc/codec-proxy/dictionaries/manifest.json"',
    )
    zstd_dicts: tuple[str, ...] = option(
        (),
        help="zstd dictionary for one format, FORMAT=PATH (msgpack or protobuf; repeatable)",
        flag="zstd-dict",
    )

    # --- compressed JSON responses (docs/COMPRESSION.md "JSON responses") ---
    # Off by default: on, a client that offers gzip, br or zstd receives compressed what it
    # received plain before (decoded, the same bytes), so turning it on is the operator's call.
    json_compression: Literal["off", "on"] = option(
        "off",
        help="compress JSON responses for clients that accept gzip, br or zstd: streams on the "
        "flush schedule, whole bodies whole (off: as the upstream sent them)",
    )

    # --- when not to compress (docs/COMPRESSION.md "When not to compress"): a compressed answer
    # that holds a secret beside text a third party chose tells its length's observer whether
    # a guess at the secret was right (BREACH). These change at run time (SIGHUP).
    uncompressed: bool = option(
        False,
        help="send responses uncompressed, Codec and JSON, whatever the client accepts (a "
        "model's own in its `models` entry)",
    )
    uncompressed_keys: tuple[str, ...] = option(
        (),
        help="API keys (Bearer tokens) whose responses are sent uncompressed, Codec and JSON",
        secret=True,
    )

    # --- rolling Codec out (docs/ROLLOUT.md); these change at run time (SIGHUP) ---
    # Decided before any upstream contact; a refused Codec request gets 403
    # `codec_not_enabled` and JSON requests are never affected (proxy/core/http/access.py).
    codec_enabled: bool = option(True, help="serve Codec at all (JSON requests always pass)")
    codec_allow_keys: tuple[str, ...] = option(
        (), help="only these API keys (Bearer tokens) get Codec (empty: every key)", secret=True
    )
    codec_deny_keys: tuple[str, ...] = option(
        (), help="these API keys (Bearer tokens) never get Codec", secret=True
    )
    codec_client_header: str | None = option(
        None, help="request header that names the client, for codec_allow/deny_clients"
    )
    codec_allow_clients: tuple[str, ...] = option(
        (),
        help="only clients whose codec_client_header is one of these get Codec "
        "(a trailing * matches a prefix; empty: every client)",
    )
    codec_deny_clients: tuple[str, ...] = option(
        (), help="clients whose codec_client_header is one of these never get Codec"
    )
    # Continuous verification (docs/ROLLOUT.md): the IDs a sampled stream sends, decoded with the
    # published map as a client decodes them, against the text the upstream streamed.
    verify_sample_rate: float = option(
        0.01,
        help="share of Codec streams verified as they are served (0: none)",
        minimum=0,
        maximum=1,
        drawn=True,
    )
    verify_refuse_after: int = option(
        0,
        help="this many verification mismatches within verify_window refuse Codec for the "
        "model until a reload or a clean drift check (0: never)",
        minimum=0,
    )
    verify_window: float = option(
        300.0, help="seconds over which verify_refuse_after counts mismatches", minimum=1
    )

    # --- process ---
    pid_file: Path | None = option(
        None, help="write the process id here, for `codec-proxy reload` (SIGHUP)"
    )
    workers: int = option(1, help="worker processes sharing the port (SO_REUSEPORT)", minimum=1)
    event_loop: Literal["auto", "uvloop", "asyncio"] = option(
        "auto", help="the event loop: uvloop when it is installed (auto), or asyncio's own"
    )
    log_format: Literal["json", "text"] = option("json", help="access and event log format")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = option("INFO", help="log level")

    # --- traces (docs/DEPLOY.md "Traces"); the other OTEL_* variables configure the rest ---
    # vLLM's flag has this name. The standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and
    # OTEL_EXPORTER_OTLP_ENDPOINT turn traces on too (proxy/trace_endpoint.py).
    otlp_traces_endpoint: str | None = option(
        None,
        help="export OpenTelemetry traces over OTLP/HTTP to this URL (a bare collector URL gets "
        "/v1/traces); unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT "
        "if set, else no traces",
        url=True,
    )
    # Off for an endpoint open to callers whose trace context is only their word: otherwise any
    # of them decides what is sampled and puts its spans into another's trace.
    trust_trace_context: bool = option(
        True,
        help="a caller's traceparent is the parent of the proxy's spans and decides their "
        "sampling, and its trace context goes upstream; false (internet-facing): each request "
        "starts its own trace, the caller's kept only as a span link, none of it sent upstream",
    )

    def __post_init__(self) -> None:
        # One URL where a list is expected is a list of one (Settings(upstream="http://...")).
        upstream: object = self.upstream
        if isinstance(upstream, str):
            object.__setattr__(self, "upstream", (upstream,))
        tokenizer: object = self.tokenizer
        if isinstance(tokenizer, str):
            object.__setattr__(self, "tokenizer", Path(tokenizer))
        if self.admin_port is not None and self.admin_port == self.port:
            raise ValueError(f"'admin_port' {self.admin_port} is also 'port': give it its own")
        if self.models:
            given = [n for n in ("upstream", "tokenizer", "model", "map_id", "zstd_dicts")
                     if getattr(self, n)]  # fmt: skip
            if given:
                raise ValueError(
                    f"{given[0]!r} is per model when 'models' is set: put it in the model's entry"
                )
            seen: dict[str, tuple[int, str]] = {}
            for index, entry in enumerate(self.models):
                for name in entry.names:
                    if name not in seen:
                        seen[name] = (index, entry.name)
                        continue
                    # Two entries with one name, or an entry that gives a name twice, each
                    # get their own words: "the name 'a' is also model 'a''s" named neither.
                    other_index, other = seen[name]
                    if other_index == index:
                        raise ValueError(f"model {entry.name!r}: the name {name!r} is listed twice")
                    if other == entry.name:
                        raise ValueError(f"two models are named {name!r}")
                    raise ValueError(
                        f"model {entry.name!r}: the name {name!r} is also model {other!r}'s"
                    )
            if self.default_model is not None and self.default_model not in seen:
                raise ValueError(f"'default_model' {self.default_model!r} is not a listed model")
        else:
            if self.default_model is not None:
                raise ValueError("'default_model' needs a 'models' list")
            if not self.upstream:
                raise ValueError("'upstream' needs at least one URL")
        for model in self.model_list():
            self._check_protocol(model)

    def _check_protocol(self, model: ModelConfig) -> None:
        """What a model's upstream protocol needs, and what it has no use for."""
        where = f"model {model.name!r}: " if self.models else ""
        if model.upstream_protocol != CODEC:
            if model.tokenizer is None:
                raise ValueError(f"{where}'tokenizer' is required")
            return
        # One source for the map a Codec upstream's IDs follow: the upstream's own, pinned by
        # its digest. A local tokenizer could only disagree with it.
        unused = [name for name, value in (("tokenizer", model.tokenizer),
                  ("map_id", model.map_id), ("zstd_dicts", model.zstd_dicts)) if value]  # fmt: skip
        if unused:
            raise ValueError(
                f'{where}{unused[0]!r} is not used with upstream_protocol = "codec": the '
                "upstream's published map is the tokenizer; leave it out"
            )
        if self.safety_policy is not None:
            # The policy is compiled against a tokenizer and applied to the upstream's text;
            # police at the Codec server, whose clients this proxy's are.
            raise ValueError(
                f"{where}'safety_policy' cannot police a model with upstream_protocol = "
                '"codec"; set it on the Codec server upstream'
            )

    @property
    def probe_port(self) -> int:
        """Where /livez, /readyz and the proxy's own /metrics answer."""
        return self.port if self.admin_port is None else self.admin_port

    def model_list(self) -> tuple[ModelConfig, ...]:
        """Every model, the default first, with each unset key taken from the top level."""
        if not self.models:
            entry = ModelSettings(
                name=self.model or UNNAMED_MODEL,
                upstreams=self.upstream,
                tokenizer=self.tokenizer,
                map_id=self.map_id,
                zstd_dicts=self.zstd_dicts,
            )
            return (self._resolved(entry, default=True, single=True),)
        default = self.default_model or self.models[0].name
        first = next(m for m in self.models if default in m.names)
        rest = [m for m in self.models if m is not first]
        return tuple(self._resolved(m, default=m is first) for m in (first, *rest))

    def _resolved(
        self, entry: ModelSettings, *, default: bool, single: bool = False
    ) -> ModelConfig:
        def pick(name: str) -> Any:
            own = getattr(entry, name)
            return getattr(self, name) if own is None else own

        return ModelConfig(
            name=entry.name,
            names=entry.names,
            upstreams=entry.upstreams,
            tokenizer=entry.tokenizer,
            upstream_model=entry.upstream_model,
            # One model by `upstream`/`tokenizer`: `model` as it always was (None: ask the
            # upstream). Several: each goes up under its own name.
            request_default=self.model if single else entry.upstream_model or entry.name,
            map_id=entry.map_id,
            zstd_dicts=entry.zstd_dicts,
            codec_enabled=entry.codec_enabled,
            required=default if entry.required is None else entry.required,
            token_ids=pick("token_ids"),
            backend=pick("backend"),
            drift_check=pick("drift_check"),
            drift_check_interval=pick("drift_check_interval"),
            max_prompt_ids=pick("max_prompt_ids"),
            flush_interval_ms=pick("flush_interval_ms"),
            flush_frames=pick("flush_frames"),
            max_streams=entry.max_streams or self.model_max_streams(),
            upstream_protocol=pick("upstream_protocol"),
            upstream_stream_format=pick("upstream_stream_format"),
            uncompressed=pick("uncompressed"),
            any_name=single,
            is_default=default,
        )

    def model_max_streams(self) -> int:
        """A model's share of `max_streams` unless its entry says: with several models, half,
        so that one model whose backend stalls leaves the other half to the rest, and a busy
        model still has half the process when the others are idle (an even split would idle
        what they do not use). With one model, all of it."""
        if len(self.models) < 2:
            return self.max_streams
        return -(-self.max_streams // 2)

    def __repr__(self) -> str:
        # Secrets never reach a log line through a repr.
        parts = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.metadata.get("option", Option()).secret and value:
                value = "<redacted>"
            parts.append(without_credentials(f"{field.name}={value!r}"))
        return f"Settings({', '.join(parts)})"

    def api_keys(self) -> frozenset[str]:
        """Every accepted local API key: `api_key`'s and the key file's. `ConfigError` when the
        key file cannot be read or holds no key."""
        keys = set(self.api_key)
        if self.api_key_file is not None:
            keys.update(read_key_file(self.api_key_file))
        return frozenset(keys)


def read_key_file(path: Path) -> frozenset[str]:
    """The keys of an `api_key_file`: one per line; blank lines and `# comments` are not keys.

    A file that holds no key is an error, never "no keys": an empty Secret mount, or a file
    caught half-way through a rotation, would otherwise turn authentication off. Messages never
    name the path, which the settings treat as secret, nor any of its text.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read 'api_key_file': {exc.strerror or type(exc).__name__}"
        ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError("'api_key_file' is not UTF-8 text") from exc
    lines = (line.strip() for line in text.splitlines())
    keys = frozenset(line for line in lines if line and not line.startswith("#"))
    if not keys:
        raise ConfigError(
            "'api_key_file' holds no API key (only blank lines or # comments); an empty key "
            "file never turns authentication off"
        )
    return keys
