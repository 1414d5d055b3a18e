"""A request's state and life: token ids, progress, status, and the time of every phase.

Token-budget model: a request holds `token_ids` (prompt, then outputs); each step the
scheduler lets `num_computed_tokens` catch up with `num_tokens` by some amount. When it
catches up, the last position's logits are sampled and one token is appended. Chunked
prefill, decode and recompute after preemption are the same rule: there are no phases.

All times are seconds (floats) on the engine clock (wall time by default).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from engine.logprobs import MAX_LOGPROBS, TokenLogprob
from engine.structured.spec import StructuredOutput


class RequestStatus(enum.IntEnum):
    """Ordered: every status above PREEMPTED is a finished one."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    STOPPED = 3  # EOS, a stop token or a stop string
    LENGTH = 4  # max_tokens or max_model_len reached
    CANCELLED = 5  # aborted by the client or the operator
    TIMEOUT = 6  # queue timeout, request timeout, or deadline passed (queued or running)
    REJECTED = 7  # refused by admission
    ERROR = 8

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


FINISH_REASONS = {
    RequestStatus.STOPPED: "stop",
    RequestStatus.LENGTH: "length",
    RequestStatus.CANCELLED: "cancelled",
    RequestStatus.TIMEOUT: "timeout",
    RequestStatus.REJECTED: "rejected",
    RequestStatus.ERROR: "error",
}


REPETITION_PENALTY_RANGE = (0.01, 100.0)  # logits stay finite in float32 (|logit| < 1e4)
GREEDY_BELOW = 1e-5  # a temperature under this samples greedily (vLLM's epsilon)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick and when to stop. `temperature=0` (or under GREEDY_BELOW) is greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Logits processors (engine/execution/sampler.py), greedy rows included; the defaults are off.
    presence_penalty: float = 0.0  # OpenAI's: minus this once per token already generated
    frequency_penalty: float = 0.0  # OpenAI's: minus this times the token's output count
    repetition_penalty: float = 1.0  # transformers': over prompt + output, > 1 discourages
    # token id -> added to its logit; a dict is kept as sorted (id, bias) pairs (hashable)
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_p: float = 0.0  # drop tokens whose probability < min_p * the row's top probability
    min_tokens: int = 0  # EOS and stop_token_ids cannot be sampled before this many outputs
    # Logprobs of the raw model distribution (engine/logprobs.py). None: off; N: each
    # sampled token's logprob and the N likeliest alternatives (0..MAX_LOGPROBS).
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for every prompt token after the first
    # JSON output by grammar (engine/structured; compiled by the frontend): None: off
    structured_output: StructuredOutput | None = None
    # whether any processor above is on: the sampler skips them all for a step without one
    uses_processors: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, dict) else (bias or ())
        object.__setattr__(self, "logit_bias",
                           tuple(sorted((int(t), float(b)) for t, b in pairs)))
        if 0.0 < self.temperature < GREEDY_BELOW:  # as vLLM: logits / 1e-40 overflow
            object.__setattr__(self, "temperature", 0.0)
        self.validate()
        object.__setattr__(self, "uses_processors", bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
            or self.logit_bias or self.min_tokens))

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an integer >= 1")
        if not (0.0 <= self.temperature <= 100.0) or math.isnan(self.temperature):
            raise ValueError(f"temperature={self.temperature!r} must be in [0, 100]")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be >= 0 (0 turns it off)")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        self._validate_processors()
        if not isinstance(self.structured_output, StructuredOutput | None):
            raise ValueError(f"structured_output={self.structured_output!r} must be a"
                             " StructuredOutput (engine.structured) or None")
        if self.structured_output is not None and (self.ignore_eos or self.min_tokens):
            name = "ignore_eos" if self.ignore_eos else "min_tokens"
            raise ValueError(f"{name}={getattr(self, name)!r} cannot be combined with"
                             " response_format: the grammar ends the output with EOS")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name}={value!r} must be an integer in [0, {MAX_LOGPROBS}]"
                                 " (or None: off)")

    def token_ids_outside(self, vocab_size: int) -> dict[str, list[int]]:
        """The token ids these parameters carry that are not in 0..vocab_size-1, by field
        (empty: none). Every id a request carries indexes a [.., vocab_size] tensor (the
        stop mask of min_tokens, logit_bias): one outside fails the whole batch's step, and
        on a GPU a negative one is a device-side assert that takes the process down."""
        fields = {"stop_token_ids": self.stop_token_ids,
                  "logit_bias": [t for t, _ in self.logit_bias]}
        out = {name: sorted({t for t in ids if not 0 <= t < vocab_size})
               for name, ids in fields.items()}
        return {name: ids for name, ids in out.items() if ids}

    def _validate_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name}={value!r} must be in [-2, 2]")
        # NOTE: bounded both ways: a positive logit divided by 5e-324 is +inf (and the
        # sampler's candidate count goes wrong), a negative one times 1e300 is -inf
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise ValueError(f"repetition_penalty={self.repetition_penalty!r} must be in"
                             f" [{low}, {high}] (1 turns it off)")
        bad = [(t, b) for t, b in self.logit_bias if t < 0 or not -100.0 <= b <= 100.0]
        if bad:
            raise ValueError(f"logit_bias={dict(bad)!r}: token ids must be >= 0 and biases"
                             " in [-100, 100]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p={self.min_p!r} must be in [0, 1]")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens!r} must be an integer in"
                             f" [0, max_tokens={self.max_tokens}]")


@dataclass(frozen=True, slots=True)
class TraceLink:
    """A request's place in the caller's distributed trace (W3C trace context), carried
    through the engine untouched so every record of the request names it. Plain hex
    strings: the engine imports no tracing library (control/otel/ reads them)."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    span_id: str  # 16 hex digits: the server's span for this request
    parent_span_id: str = ""  # the caller's span; "": the request started the trace
    sampled: bool = False  # the caller's sampled flag (W3C trace-flags bit 0)
    # span attributes only the front end knows (operation, max_tokens, server address):
    # (name, str | int | float | bool) pairs, read by control/otel/spans.py
    attributes: tuple[tuple[str, object], ...] = ()


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    tenant: str = "default"
    cache_salt: str | None = None  # prefix-cache domain instead of the tenant (prefix_hash)
    lane: str = ""
    priority: int = 0  # smaller runs first (as in vLLM)
    deadline: float | None = None  # absolute engine-clock time by which it must finish
    eos_token_id: int | tuple[int, ...] | None = None  # a model may have several
    trace: TraceLink | None = None  # the caller's trace (control/otel), None: not traced
    # Admitted past its lane's TTFT target (slo_unreachable: defer): queued behind every
    # request of its lane that can still meet it (engine/lanes/admission.py, check_slo)
    slo_deferred: bool = False
    # Its client sent it before and was refused (an SDK's resend): its user has waited
    # since a send this server never saw, so it counts as past its TTFT target
    # (engine/lanes/admission.py, check_slo)
    resent: bool = False

    token_ids: list[int] = field(default_factory=list)  # prompt + outputs
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache (first schedule)
    status: RequestStatus = RequestStatus.WAITING
    block_ids: list[int] = field(default_factory=list)  # written by BlockManager only
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks
    num_preemptions: int = 0
    finish_reason: str | None = None
    finish_detail: str = ""

    admitted_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    prefill_done_time: float | None = None  # when the prompt was last fully computed
    queue_seq: int = 0  # tie-breaker for queue order, set by the lane queue
    stop_token_ids: frozenset[int] = frozenset()  # stop tokens, EOS among them unless ignored
    max_num_tokens: int = 0  # prompt + max_tokens: the request ends with LENGTH there
    decoding: bool = False  # running with its prompt computed: one token per step
    sampling_state: object = None  # the sampler's per-request generator
    grammar: object = None  # structured output's matcher (engine/structured/constrain.py)
    # One entry per output token while sampling_params.logprobs is set (an executor without
    # a model adds none); prompt_logprobs: entry i is prompt token i + 1's (the first token
    # has none), filled chunk by chunk while sampling_params.prompt_logprobs is set.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    # n > 1: a later choice waits for the first choice (same prompt, same cache domain) to
    # compute the prompt, then takes its full blocks from the prefix cache
    wait_for: Request | None = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        params = self.sampling_params
        stops = set(params.stop_token_ids)
        if self.eos_token_id is not None and not params.ignore_eos:
            eos = self.eos_token_id
            stops.update((eos,) if isinstance(eos, int) else eos)
        self.stop_token_ids = frozenset(stops)
        self.max_num_tokens = self.num_prompt_tokens + params.max_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    @property
    def waits_for_sibling(self) -> bool:
        """Queued behind `wait_for`'s prompt: while that request is queued or running and
        its prompt is not computed (preempted or finished: no more waiting)."""
        lead = self.wait_for
        return (lead is not None and lead.status <= RequestStatus.RUNNING
                and lead.num_computed_tokens < lead.num_prompt_tokens)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """It asks for prompt logprobs that are not all computed yet: it must compute its
        whole prompt (no prefix-cache hits, which would skip positions), as vLLM does."""
        return (self.sampling_params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < self.num_prompt_tokens - 1)

    def set_finished(self, status: RequestStatus, now: float, detail: str = "") -> None:
        """Record the end: status, finish reason, time (the caller frees what it held)."""
        self.status = status
        self.finished_time = now
        self.finish_reason = FINISH_REASONS[status]
        self.finish_detail = detail

    @property
    def is_prefill(self) -> bool:
        """More than the last sampled token is still to compute (prompt or recompute)."""
        return self.num_tokens - self.num_computed_tokens > 1 or (
            self.num_computed_tokens < self.num_prompt_tokens)

    # Derived latencies in seconds; None until the phase happened.
    @property
    def queue_delay_s(self) -> float | None:
        return _diff(self.first_scheduled_time, self.arrival_time)

    @property
    def ttft_s(self) -> float | None:
        return _diff(self.first_token_time, self.arrival_time)

    @property
    def e2e_s(self) -> float | None:
        return _diff(self.finished_time, self.arrival_time)

    @property
    def prefill_time_s(self) -> float | None:
        return _diff(self.first_token_time, self.first_scheduled_time)

    @property
    def decode_time_s(self) -> float | None:
        if self.first_token_time is None or not self.token_times:
            return None
        return self.token_times[-1] - self.first_token_time

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: (last - first) / (n - 1)."""
        n = len(self.token_times)
        if n < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)


def _diff(end: float | None, start: float | None) -> float | None:
    if end is None or start is None:
        return None
    return end - start
