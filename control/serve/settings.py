"""What `batchpilot serve` is told at start: model, config file, address, time limits.

Engine budgets do not live here: they come from the YAML config (`--config`), fitted to
the model (see `engine.llm.fit_engine_config`). The long-prompt routing rule, for one, is
the engine config's `long_context_threshold` / `long_context_lane`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from control.api.limits import RequestLimits
from control.otel.settings import OtelSettings
from control.trace.retention import Retention
from engine.config.dtype_option import parse_dtype_choice

DEFAULT_MODEL = "smollm2-135m"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
EDGE_MODES = ("auto", "on", "off")
COMPAT_MODES = ("vllm", "otel")  # --metrics-compat (control/metrics/gateway.py)
# NOTE (uvicorn's timeout_keep_alive, the server's and the edge's): an idle keep-alive
# connection is closed only after clients' pools give up on it. uvicorn's default (5 s)
# equals httpx's and the openai client's pool expiry, so a client reusing a connection as
# the server closes it gets a connection error instead of an answer (50 of 20,000 requests
# in bench.hostile_traffic). 65 s also outlasts the 60 s idle timeout of common load
# balancers in front of a server.
KEEP_ALIVE_S = 65


@dataclass(frozen=True)
class ServeSettings:
    model: str = DEFAULT_MODEL  # alias, checkpoint directory or .gguf file
    config_path: str | None = None  # serving YAML; None: the embedded defaults
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the ready line says which)
    served_model_name: str | None = None  # the id in /v1/models; None: from `model`
    trace_db: str | None = None  # DuckDB file for the scheduler trace; None: no trace
    trace_max_age_s: float | None = None  # retention by age; None: keep everything
    trace_max_bytes: int | None = None  # retention by size; None: no limit
    trace_queue: int = 20_000  # steps the trace writer may fall behind before dropping
    kv_snapshot_every: int = 50  # steps between KV snapshots (plus watermark crossings)
    metrics_tenants: tuple[str, ...] = ()  # tenants with their own label; others: "other"
    # "vllm": /metrics also under vLLM's names (gateways); "otel": also the GenAI server
    # histograms of the OpenTelemetry conventions (control/metrics/genai.py)
    metrics_compat: str | None = None
    control_api: bool = True  # the /control API (steer budgets, lanes, profiles live)
    control_tokens_path: str | None = None  # "name scope secret" lines; see control/admin/auth.py
    watch_config: bool = True  # reload the --config YAML when it changes (and on SIGHUP)
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str = "auto"  # auto | float32 | bfloat16 (engine/models/cpu_dtype.py)
    shutdown_grace_s: float = 30.0  # SIGTERM: in-flight requests get this long to finish
    max_request_timeout_s: float = 600.0  # cap (and default) for X-Request-Timeout-Ms
    stall_after_s: float = 60.0  # /readyz fails when a step has run longer than this
    engine_overrides: dict[str, Any] = field(default_factory=dict)  # over the YAML's values
    limits: RequestLimits = field(default_factory=RequestLimits)  # --limit NAME=VALUE
    log_level: str = "info"
    # auto | on | off: parse and validate bodies in a process of their own (control/edge/);
    # auto: on when `host` is not loopback, i.e. when strangers can reach the server
    edge: str = "auto"
    # OpenTelemetry: a trace per request to this OTLP collector; None: no export
    # (control/otel/feed.py, docs/opentelemetry.md)
    otlp_traces_endpoint: str | None = None
    otlp_protocol: str = "http/protobuf"  # or grpc
    otlp_sample_ratio: float = 1.0
    otlp_slow_ttft_s: float | None = None  # slower first tokens: always exported
    replica_name: str = ""  # set by a fleet replica: its name on spans
    # a fleet replica under `--routing precise`: publish KV events (engine/kv/events.py),
    # prefix hashes keyed with the fleet's secret (shared with its ingress only)
    kv_events: bool = False
    prefix_hash_key: bytes | None = field(default=None, repr=False)

    def validate(self) -> ServeSettings:
        _require(0 <= self.port <= 65535, "port", self.port, "in 0..65535")
        _require(self.shutdown_grace_s >= 0, "shutdown_grace_s", self.shutdown_grace_s, ">= 0")
        _require(self.max_request_timeout_s > 0, "max_request_timeout_s",
                 self.max_request_timeout_s, "> 0")
        _require(self.stall_after_s > 0, "stall_after_s", self.stall_after_s, "> 0")
        _require(self.trace_queue >= 1, "trace_queue", self.trace_queue, ">= 1")
        _require(self.kv_snapshot_every >= 1, "kv_snapshot_every", self.kv_snapshot_every,
                 ">= 1")
        _require(len(self.metrics_tenants) <= 100, "metrics_tenants",
                 len(self.metrics_tenants), "at most 100 names (each is a label value)")
        parse_dtype_choice(self.dtype)  # ValueError naming the choices
        _require(self.metrics_compat in (None, *COMPAT_MODES), "metrics_compat",
                 self.metrics_compat, f"one of {COMPAT_MODES} or unset")
        _require(self.edge in EDGE_MODES, "edge", self.edge, f"one of {', '.join(EDGE_MODES)}")
        self.trace_retention.validate()
        self.limits.validate()
        if self.otlp is not None:
            self.otlp.validate()
        return self

    @property
    def otlp(self) -> OtelSettings | None:
        if self.otlp_traces_endpoint is None:
            return None
        return OtelSettings(self.otlp_traces_endpoint, self.otlp_protocol,
                            self.otlp_sample_ratio, self.otlp_slow_ttft_s,
                            replica=self.replica_name)

    @property
    def trace_retention(self) -> Retention:
        return Retention(max_age_s=self.trace_max_age_s, max_bytes=self.trace_max_bytes)

    @property
    def behind_edge(self) -> bool:
        """Whether the server listens on a Unix socket behind its edge process."""
        return self.edge == "on" or (self.edge == "auto" and self.host not in LOOPBACK_HOSTS)

    @property
    def model_name(self) -> str:
        """The id clients send as `model` and see in /v1/models."""
        if self.served_model_name:
            return self.served_model_name
        return self.model.rstrip("/").rsplit("/", 1)[-1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def replace(self, **changes: Any) -> ServeSettings:
        return dataclasses.replace(self, **changes)


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} must be {allowed}")
