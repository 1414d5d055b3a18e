"""Token budgets fitted to the device: one step stays under `target_step_ms`.

At start-up, when the operator set neither `prefill_chunk_size` nor
`max_num_batched_tokens` (or only one of them), a few prefill steps of doubling size run
through the real `ModelRunner` (16, 32, 64, ... tokens; a dummy request in the still-empty
KV pool), and a line is fitted by least squares:

    step_s(tokens) ~= intercept_s + per_token_s * tokens

The rule, with `target_s = target_step_ms / 1000`:

    step_tokens            = floor((target_s - intercept_s) / per_token_s)  # one step's room
                             but >= intercept_s / per_token_s           # see below
    prefill_chunk_size     = largest power of two <= 2/3 * step_tokens      # >= 16
    max_num_batched_tokens = max(step_tokens, prefill_chunk_size * 3/2)

so a step filled to the budget is predicted under the target, and a full chunk still
leaves a third of it to running decodes and newly arrived prompts (each decode counts as
one token of the law: decode attention over a long context costs more, which the margin
of the 2/3 absorbs only in part). Without that third, a long prompt's chunks would take
the whole budget step after step and a short request arriving behind it would wait for
the entire prefill.

Where the fixed cost alone nearly fills the target (a slow or busy device), the target is
out of reach; budgets cut down to a few tokens would then spend most of each step on the
fixed cost and run far fewer tokens per second. So a step is never sized below the
tokens whose cost equals the fixed cost (the fixed cost at most half the step), and the
note says the target is missed. The fit only ever
lowers the built-in defaults (2048 / 8192): a device fast enough keeps them. A value the
operator set is kept as given; the budget is then never fitted below their chunk. With
`chunked_prefill` off nothing is fitted (the budget must hold a whole prompt).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.records import PrefillChunk, SchedulerOutput
from engine.request import Request, SamplingParams

FITTED_FIELDS = ("prefill_chunk_size", "max_num_batched_tokens")
MIN_CHUNK = 16  # tokens; also the first probe size
CHUNK_SHARE = 2 / 3  # of one step's tokens, for the prefill chunk; the rest for decodes
PROBE_MAX_S = 2.0
MIN_POINTS = 3  # the measurement stops starting new probes after this long

StepTimer = Callable[[int], float]  # tokens -> seconds of one prefill step of that size


@dataclass(frozen=True)
class StepFit:
    """What was fitted, from what measurement, and why."""

    target_step_ms: int
    points: tuple[tuple[int, float], ...]  # (tokens, seconds) of the probe steps
    intercept_s: float
    per_token_s: float
    step_tokens: int  # tokens one step may run within the target, by the law
    fitted: dict[str, int]  # field -> value chosen (only those the operator left unset)
    kept: dict[str, int]  # field -> the operator's value, not fitted
    note: str = ""  # e.g. the target is unreachable

    def predicted_ms(self, tokens: int) -> float:
        return 1000.0 * (self.intercept_s + self.per_token_s * tokens)

    def summary(self) -> str:
        """One line for the ready banner."""
        chosen = ", ".join(f"{k}={v}" for k, v in {**self.fitted, **self.kept}.items())
        law = (f"measured {1000 * self.per_token_s:.3g} ms/token"
               f" + {1000 * self.intercept_s:.3g} ms")
        kept = f"; set in config: {', '.join(self.kept)}" if self.kept else ""
        note = f"; {self.note}" if self.note else ""
        return f"budgets: {chosen} fitted to {self.target_step_ms} ms steps ({law}){kept}{note}"

    def to_dict(self) -> dict:
        return {"target_step_ms": self.target_step_ms, "fitted": dict(self.fitted),
                "kept": dict(self.kept),
                "law": {"intercept_ms": round(1000 * self.intercept_s, 3),
                        "per_token_ms": round(1000 * self.per_token_s, 4)},
                "step_tokens": self.step_tokens,
                "points": [{"tokens": n, "ms": round(1000 * s, 3)} for n, s in self.points],
                "rule": "max_num_batched_tokens = the tokens one step runs within the"
                        " target by the law (never fewer than the fixed cost's worth) and"
                        " at least 3/2 of the chunk; prefill_chunk_size = the largest power"
                        " of two <= 2/3 of them; neither above the built-in default",
                "summary": self.summary(), "note": self.note}


def needs_fit(config: EngineConfig, explicit: set[str]) -> bool:
    return (config.static.target_step_ms > 0 and config.live.chunked_prefill
            and not set(FITTED_FIELDS) <= explicit)


def fit_step_budgets(config: EngineConfig, explicit: set[str], step_seconds: StepTimer,
                     ) -> tuple[EngineConfig, StepFit | None]:
    """`config` with the budgets the operator did not set fitted to `step_seconds`, and the
    record of the fit; (config, None) when nothing is to be fitted (see `needs_fit`)."""
    if not needs_fit(config, explicit):
        return config, None
    static, live = config.static, config.live
    target_s = static.target_step_ms / 1000
    points = measure(step_seconds, target_s, max_tokens=_probe_cap(config))
    intercept_s, per_token_s = fit_line(points)
    step_tokens = max(0, math.floor((target_s - intercept_s) / per_token_s),
                      math.floor(intercept_s / per_token_s))
    kept = {k: getattr(live, k) for k in FITTED_FIELDS if k in explicit}
    chunk = kept.get("prefill_chunk_size")
    if chunk is None:
        room = min(step_tokens * CHUNK_SHARE, kept.get("max_num_batched_tokens", 1 << 30))
        chunk = min(max(MIN_CHUNK, _pow2_floor(room)), live.prefill_chunk_size)
    budget = kept.get("max_num_batched_tokens")
    if budget is None:
        floor = chunk if "prefill_chunk_size" in kept else math.ceil(chunk / CHUNK_SHARE)
        budget = max(min(step_tokens, live.max_num_batched_tokens), floor)
    fitted = {k: v for k, v in (("prefill_chunk_size", chunk),
                                ("max_num_batched_tokens", budget)) if k not in kept}
    fit = StepFit(static.target_step_ms, tuple(points), intercept_s, per_token_s,
                  step_tokens, fitted, kept)
    if all(v == getattr(live, k) for k, v in fitted.items()):
        fit = _with_note(fit, "the built-in defaults already fit the target")
    elif fit.predicted_ms(budget) > static.target_step_ms:
        fit = _with_note(fit, f"a {budget}-token step is predicted at"
                              f" {fit.predicted_ms(budget):.0f} ms, over the target")
    return EngineConfig(static, live.replace(**fitted)).validate(), fit


def measure(step_seconds: StepTimer, target_s: float, *, max_tokens: int,
            clock: Callable[[], float] = time.perf_counter) -> list[tuple[int, float]]:
    """Probe steps of 16, 32, 64, ... tokens (the best of two runs each, after one
    warm-up) until one takes half the target, `max_tokens` is reached or PROBE_MAX_S has
    passed; at least three sizes where `max_tokens` allows (two close points make a noisy
slope)."""
    sizes = [MIN_CHUNK << i for i in range(32) if MIN_CHUNK << i <= max_tokens]
    if len(sizes) < 2:
        sizes = [max(1, max_tokens // 2), max_tokens]
    started = clock()
    step_seconds(sizes[0])  # warm-up: first-call allocations are not the law
    points: list[tuple[int, float]] = []
    for tokens in sizes:
        seconds = min(step_seconds(tokens), step_seconds(tokens))
        points.append((tokens, seconds))
        long_enough = seconds >= target_s / 2 or clock() - started > PROBE_MAX_S
        if len(points) >= MIN_POINTS and long_enough:
            break
    return points


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept_s >= 0, per_token_s > 0) of seconds over tokens."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx if sxx > 0 else 0.0
    if slope <= 0:  # flat (or noisy) over the probed sizes: charge the mean per token
        slope = max(mean_y / mean_x, 1e-9)
        return 0.0, slope
    intercept = mean_y - slope * mean_x
    if intercept < 0:  # a line through the origin instead
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return intercept, slope


class RunnerProbe:
    """`StepTimer` over the real ModelRunner: one request's prefill chunk of `tokens`
    tokens in blocks 0.., before any engine owns the pool. The blocks are zeroed again
    afterwards (`clear`), so the pool is handed over as allocated."""

    def __init__(self, runner):
        self.runner = runner
        self.blocks_used = 0

    def __call__(self, tokens: int) -> float:
        runner = self.runner
        num_blocks = -(-tokens // runner.block_size)
        self.blocks_used = max(self.blocks_used, num_blocks)
        req = Request("step-fit-probe", [0] * tokens, SamplingParams(temperature=0.0,
                                                                     max_tokens=1), 0.0)
        req.block_ids = list(range(num_blocks))
        out = SchedulerOutput(step_id=-1, decodes=[], prefills=[PrefillChunk(req, tokens, True)],
                              config_version=0, token_budget=tokens, num_prefill_tokens=tokens)
        cuda = runner.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(runner.device)
        start = time.perf_counter()
        runner.execute(out)
        if cuda:
            torch.cuda.synchronize(runner.device)
        return time.perf_counter() - start

    def clear(self) -> None:
        with torch.inference_mode():
            for k_cache, v_cache in self.runner.kv_caches:
                k_cache[: self.blocks_used].zero_()
                v_cache[: self.blocks_used].zero_()


def _probe_cap(config: EngineConfig) -> int:
    """The largest probe: no more than a default chunk, the model or the KV pool allow."""
    static = config.static
    return min(config.live.prefill_chunk_size, static.max_model_len,
               static.num_kv_blocks * static.block_size)


def _pow2_floor(x: float) -> int:
    return 1 << int(math.floor(math.log2(x))) if x >= 1 else 1


def _with_note(fit: StepFit, note: str) -> StepFit:
    return dataclasses.replace(fit, note=note)
