"""Engine configuration: the static part (restart to change) and the live part.

`LiveConfig` is an immutable, versioned snapshot. The scheduler reads it once per step;
the control plane swaps it with `Engine.update_config()`, which validates first, so a
rejected change leaves the running config untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field

from engine.config.dtype_option import DTYPE_CHOICES
from engine.config.field_types import check_dataclass_types, field_types
from engine.config.slo import LaneSLO

LANE_POLICIES = ("fcfs", "priority", "deadline")
BATCHING_MODES = ("continuous", "static")
SCHEDULE_POLICIES = ("decode_first", "mixed")
STEP_POLICIES = ("goodput", "fixed")  # engine/scheduling/goodput.py
SLO_UNREACHABLE = ("defer", "shed", "serve")  # engine/lanes/admission.py, check_slo
MAX_NUM_SEQS_LIMIT = 8192
# Lane and tenant names, as a request may send them (X-Lane, X-Tenant) and as metric
# labels carry them; a lane is scanned every step, so their number is bounded too.
MAX_NAME_CHARS = 128
MAX_LANES = 64
MAX_LANE_WEIGHT = 1e6
MAX_TENANT_LANES = 4096  # entries of tenant_lanes
PREFIX_CACHE_SHARING = ("tenant", "global")  # see engine/kv/prefix_hash.py


def printable_name(name: str) -> bool:
    """A tenant name as a config or a request may give it: 1-MAX_NAME_CHARS printable
    characters (no control characters: it becomes a metric label and a trace value)."""
    return 0 < len(name) <= MAX_NAME_CHARS and name.isprintable()


@dataclass(frozen=True)
class StaticConfig:
    """Fixed for the life of the process: changing any of these needs a restart."""

    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int = 4096  # blocks in the pool (per layer; same count for every layer)
    max_model_len: int = 32768  # prompt + output tokens, per request
    enable_prefix_caching: bool = True  # reuse full KV blocks of identical prefixes
    # Who may reuse whose cached prefix: "tenant" (default) only requests of the same tenant
    # (or of the same cache_salt); "global" every request without a cache_salt. A trust
    # boundary, so static: a hit is observable (num_cached_tokens, TTFT) by the client.
    prefix_cache_sharing: str = "tenant"
    # One step's time the server fits prefill_chunk_size and max_num_batched_tokens to at
    # start-up when the config leaves them unset (engine/calibration/budget_fit.py); 0: no fitting.
    target_step_ms: int = 250
    # The KV cache's element type: "auto" (bfloat16 where the CPU's native kernels read it in
    # place and the weights run bf16 copies, else the model's dtype; engine/models/
    # cpu_dtype.py kv_cache_dtype), "float32" or "bfloat16".
    kv_cache_dtype: str = "auto"

    def validate(self) -> None:
        check_dataclass_types(self)
        _require(self.block_size in (8, 16, 32, 64, 128), "block_size", self.block_size,
                 "one of 8, 16, 32, 64, 128")
        _require(self.num_kv_blocks >= 1, "num_kv_blocks", self.num_kv_blocks, ">= 1")
        _require(self.max_model_len >= 1, "max_model_len", self.max_model_len, ">= 1")
        _require(self.prefix_cache_sharing in PREFIX_CACHE_SHARING, "prefix_cache_sharing",
                 self.prefix_cache_sharing, f"one of {', '.join(PREFIX_CACHE_SHARING)}")
        _require(0 <= self.target_step_ms <= 60_000,
                 "target_step_ms", self.target_step_ms,
                 "an integer number of milliseconds in 1..60000, or 0 to keep the built-in"
                 " budgets unfitted")
        _require(self.kv_cache_dtype in DTYPE_CHOICES, "kv_cache_dtype", self.kv_cache_dtype,
                 f"one of {', '.join(DTYPE_CHOICES)}")


@dataclass(frozen=True)
class LaneConfig:
    """One lane (queue) of requests with its share of the token budget and its limits."""

    name: str
    weight: float = 1.0  # share of the token budget among lanes that have work
    max_running: int | None = None  # None: bounded only by max_num_seqs
    max_waiting: int | None = None  # None: bounded only by max_waiting_requests
    policy: str = "fcfs"  # order inside the lane: fcfs | priority | deadline
    tenant_fair_share: bool = False  # share the lane's tokens among its tenants by weight
    queue_timeout_ms: int | None = None  # None: the global queue_timeout_ms
    preempt_first: bool = False  # victims are taken from such lanes before others
    batching: str | None = None  # None: the global batching mode
    # A request that the KV (high watermark) keeps from starting preempts running requests
    # of preempt_first lanes, the fewest that make room (engine/scheduling/preemption.py).
    preempt_to_start: bool = False
    slo: LaneSLO | None = None  # None: the config's default_slo (engine/config/slo.py)

    def __post_init__(self) -> None:
        if not isinstance(self.slo, LaneSLO | None):  # a mapping from YAML or JSON
            object.__setattr__(self, "slo", LaneSLO.parse(self.slo, f"lanes.{self.name}.slo"))

    def validate(self) -> None:
        check_dataclass_types(self, f"lanes.{self.name}.")
        _require(bool(self.name) and self.name.replace("_", "").replace("-", "").isalnum()
                 and len(self.name) <= MAX_NAME_CHARS, "lane.name", self.name,
                 f"a name of 1-{MAX_NAME_CHARS} letters, digits, '-' and '_'")
        # (a finite cap: an infinite weight made the lanes' share of the queue inf / inf)
        _require(0 < self.weight <= MAX_LANE_WEIGHT, f"lanes.{self.name}.weight", self.weight,
                 f"> 0 and <= {MAX_LANE_WEIGHT:g} (a million to one is already strict priority)")
        for name in ("max_running", "max_waiting", "queue_timeout_ms"):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"lanes.{self.name}.{name}", value,
                     ">= 1 or null")
        _require(self.policy in LANE_POLICIES, f"lanes.{self.name}.policy", self.policy,
                 f"one of {', '.join(LANE_POLICIES)}")
        _require(self.batching is None or self.batching in BATCHING_MODES,
                 f"lanes.{self.name}.batching", self.batching,
                 f"one of {', '.join(BATCHING_MODES)} or null")
        _require(not (self.preempt_to_start and self.preempt_first),
                 f"lanes.{self.name}.preempt_to_start", self.preempt_to_start,
                 "false when preempt_first is true (the lane would preempt its own requests"
                 " to start others, back and forth)")
        if self.slo is not None:
            self.slo.validate(f"lanes.{self.name}.slo")


def default_lanes() -> tuple[LaneConfig, ...]:
    return (
        LaneConfig("interactive", weight=4.0, policy="priority",
                   slo=LaneSLO(ttft_s=5.0, tpot_s=0.5)),
        LaneConfig("long_context", weight=2.0, slo=LaneSLO(ttft_s=30.0, tpot_s=1.0)),
        LaneConfig("batch", weight=1.0, preempt_first=True),
    )


@dataclass(frozen=True)
class LiveConfig:
    """Budgets the scheduler reads once per step; hot-swappable, versioned."""

    max_num_seqs: int = 128  # running sequences at once
    max_num_batched_tokens: int = 8192  # tokens per step (prefill + decode)
    prefill_chunk_size: int = 2048  # most prompt tokens one request runs per step (chunked)
    chunked_prefill: bool = True  # False: a prompt runs whole in one step or waits
    max_waiting_requests: int = 512  # queued requests over all lanes
    queue_timeout_ms: int = 30000  # a request never scheduled by then ends as TIMEOUT
    stream_idle_timeout_ms: int = 10000  # used by the server's streams
    kv_cache_high_watermark: float = 0.88  # above: no new prefill starts
    kv_cache_reject_watermark: float = 0.95  # above: new requests are rejected
    schedule_policy: str = "decode_first"  # decode_first | mixed
    batching: str = "continuous"  # continuous | static (request-level batches)
    lanes: tuple[LaneConfig, ...] = field(default_factory=default_lanes)
    default_lane: str = "interactive"  # for requests that name no lane
    long_context_lane: str | None = "long_context"  # lane for long prompts naming none
    long_context_threshold: int = 4096  # prompt tokens from which that lane is chosen
    # tenant -> lane for the tenant's requests that name no lane (e.g. a static-batched
    # lane: continuous batching off for one tenant). Given as a mapping; kept sorted pairs.
    tenant_lanes: tuple[tuple[str, str], ...] = ()
    # The SLO of lanes that set none (engine/config/slo.py); the default: no targets.
    default_slo: LaneSLO = field(default_factory=LaneSLO)
    # goodput: each step's time target chosen for the requests that can still meet their
    # lane's SLO (engine/scheduling/goodput.py); fixed: every step held to target_step_ms.
    # Both need the start-up step law (budgets fitted); without it the budgets rule.
    step_policy: str = "goodput"
    # A request whose lane's TTFT target the queue ahead of it already rules out (under
    # step_policy goodput): shed: refused at arrival (429 slo_unreachable); defer: queued
    # behind the requests that can still meet theirs, refused only when it would not start
    # by its queue timeout (finishes more, meets fewer: bench/RESULTS.md); serve: queued
    # in its place like any other.
    slo_unreachable: str = "shed"
    version: int = 0  # assigned by the engine when the snapshot is installed

    def __post_init__(self) -> None:
        if isinstance(self.tenant_lanes, dict):
            object.__setattr__(self, "tenant_lanes", tuple(sorted(
                (str(t), str(lane)) for t, lane in self.tenant_lanes.items())))
        elif not isinstance(self.tenant_lanes, tuple):
            raise ValueError(f"tenant_lanes={self.tenant_lanes!r} must be a mapping of tenant"
                             " to lane")
        if not isinstance(self.default_slo, LaneSLO):  # a mapping from YAML or JSON
            object.__setattr__(self, "default_slo",
                               LaneSLO.parse(self.default_slo, "default_slo"))

    def lane(self, name: str) -> LaneConfig:
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)

    @property
    def lane_names(self) -> tuple[str, ...]:
        return tuple(lane.name for lane in self.lanes)

    def lane_batching(self, lane: LaneConfig) -> str:
        return lane.batching or self.batching

    def lane_slo(self, lane: LaneConfig) -> LaneSLO:
        return lane.slo if lane.slo is not None else self.default_slo

    def replace(self, **changes: object) -> LiveConfig:
        return dataclasses.replace(self, **changes)

    def validate(self, static: StaticConfig, fitted: Collection[str] = ()) -> None:
        """Raise ValueError naming the first field out of range, or the first that does not
        fit `static` (`fitted`: its fields the model chose, said so in the message)."""
        self.validate_fields()
        self.validate_fit(static, fitted)

    def validate_fields(self) -> None:
        """The checks that need no model: what a serving YAML can be refused for before the
        model is loaded (preflight)."""
        check_dataclass_types(self)
        _require(1 <= self.max_num_seqs <= MAX_NUM_SEQS_LIMIT, "max_num_seqs",
                 self.max_num_seqs, f"in 1..{MAX_NUM_SEQS_LIMIT}")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
                 self.max_num_batched_tokens, ">= 1")
        _require(self.prefill_chunk_size >= 1, "prefill_chunk_size", self.prefill_chunk_size,
                 ">= 1")
        _require(self.max_waiting_requests >= 1, "max_waiting_requests",
                 self.max_waiting_requests, ">= 1 (0 would reject every request as"
                 " queue_full, even on an idle engine)")
        _require(self.queue_timeout_ms >= 1, "queue_timeout_ms", self.queue_timeout_ms, ">= 1")
        _require(self.stream_idle_timeout_ms >= 1, "stream_idle_timeout_ms",
                 self.stream_idle_timeout_ms, ">= 1")
        _require(0.0 < self.kv_cache_high_watermark < self.kv_cache_reject_watermark <= 1.0,
                 "kv_cache_high_watermark", self.kv_cache_high_watermark,
                 f"in (0, kv_cache_reject_watermark={self.kv_cache_reject_watermark}),"
                 " and kv_cache_reject_watermark <= 1")
        _require(self.schedule_policy in SCHEDULE_POLICIES, "schedule_policy",
                 self.schedule_policy, f"one of {', '.join(SCHEDULE_POLICIES)}")
        _require(self.batching in BATCHING_MODES, "batching", self.batching,
                 f"one of {', '.join(BATCHING_MODES)}")
        _require(self.step_policy in STEP_POLICIES, "step_policy", self.step_policy,
                 f"one of {', '.join(STEP_POLICIES)}")
        _require(self.slo_unreachable in SLO_UNREACHABLE, "slo_unreachable",
                 self.slo_unreachable, f"one of {', '.join(SLO_UNREACHABLE)}")
        self.default_slo.validate("default_slo")
        self._validate_lanes()
        _require(self.long_context_threshold >= 1, "long_context_threshold",
                 self.long_context_threshold, ">= 1")

    def validate_fit(self, static: StaticConfig, fitted: Collection[str] = ()) -> None:
        """The checks against the static config. max_model_len and num_kv_blocks are fitted
        to the model (engine/llm.py `fit_engine_config`), so these run on the fitted static:
        against a default, a budget right for the model would be refused (or a wrong one
        kept)."""
        blocks = _limit(static, "num_kv_blocks", fitted)
        context = _limit(static, "max_model_len", fitted)
        _require(self.max_num_seqs <= static.num_kv_blocks, "max_num_seqs", self.max_num_seqs,
                 f"<= {blocks}: each sequence needs a block")
        _require(self.prefill_chunk_size <= static.max_model_len, "prefill_chunk_size",
                 self.prefill_chunk_size, f"in 1..{context}")
        if not self.chunked_prefill:
            _require(self.max_num_batched_tokens >= static.max_model_len,
                     "max_num_batched_tokens", self.max_num_batched_tokens,
                     f">= {context} when chunked_prefill is off, or a long prompt could"
                     " never run")

    def _validate_lanes(self) -> None:
        _require(1 <= len(self.lanes) <= MAX_LANES, "lanes", len(self.lanes),
                 f"1-{MAX_LANES} lanes")
        _require(len(self.tenant_lanes) <= MAX_TENANT_LANES, "tenant_lanes",
                 len(self.tenant_lanes), f"at most {MAX_TENANT_LANES} tenants")
        names = self.lane_names
        _require(len(set(names)) == len(names), "lanes", list(names), "unique lane names")
        for lane in self.lanes:
            lane.validate()
        _require(self.default_lane in names, "default_lane", self.default_lane,
                 f"one of the lanes ({', '.join(names)})")
        _require(self.long_context_lane is None or self.long_context_lane in names,
                 "long_context_lane", self.long_context_lane,
                 f"one of the lanes ({', '.join(names)}) or null")
        for tenant, lane in self.tenant_lanes:
            _require(printable_name(tenant),
                     "tenant_lanes", tenant,
                     f"keyed by tenant names of 1-{MAX_NAME_CHARS} printable characters")
            _require(lane in names, f"tenant_lanes.{tenant}", lane,
                     f"one of the lanes ({', '.join(names)})")


@dataclass(frozen=True)
class EngineConfig:
    static: StaticConfig = field(default_factory=StaticConfig)
    live: LiveConfig = field(default_factory=LiveConfig)

    def validate(self, fitted: Collection[str] = ()) -> EngineConfig:
        """`fitted`: the static fields fitted to the model, named so in messages."""
        self.static.validate()
        self.live.validate(self.static, fitted)
        return self


def _limit(static: StaticConfig, name: str, fitted: Collection[str]) -> str:
    """'max_model_len (8192)', and which value it is when the model chose it: a message
    must name the limit the server runs with, not the one the YAML or a default gave."""
    value = getattr(static, name)
    return f"{name} ({value}, fitted to the model)" if name in fitted else f"{name} ({value})"


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} must be {allowed}")


# Field name -> (type, null allowed), for values before a config is built from them.
FIELD_TYPES = {**field_types(StaticConfig), **field_types(LiveConfig)}  # serving, profiles
LANE_FIELD_TYPES = field_types(LaneConfig)
