"""Budgets fitted to the device: one step stays under `target_step_ms`.

At start-up, when the operator set neither `prefill_chunk_size` nor
`max_num_batched_tokens` (or only one of them), a few steps of known composition run
through the real `ModelRunner` (engine/calibration/probe.py: prefill chunks of doubling size,
chunks deep into a long prompt, batches of decodes over long contexts) and the step law
is fitted to them (engine/calibration/step_law.py):

    step_s ~= fixed_s + token_s * tokens + prefill_pair_s * prefill_pairs
              + decode_kv_s * decode_context                    (a step with a prompt)
    step_s ~= decode_fixed_s + decode_row_s * decodes
              + decode_kv_s * decode_context                    (decodes alone)

Two things follow from the law, with `target_s = target_step_ms / 1000`:

1. The token budgets, as for a step of one prompt's first chunk:

    step_tokens            = the largest chunk from position 0 with fixed + chunk <= target
                             but >= the tokens whose cost equals the fixed cost (see below)
    prefill_chunk_size     = largest power of two <= 2/3 * step_tokens      # >= 16
    max_num_batched_tokens = max(step_tokens, prefill_chunk_size * 3/2)

   so a full chunk leaves a third of the step to running decodes and newly arrived
   prompts: without that third, a long prompt's chunks would take the whole budget step
   after step and a short request arriving behind it would wait for the entire prefill.

2. The step's time budget (`Engine(step_law=...)`, engine/scheduling/step_time.py): the scheduler
   predicts each step's time by the law as it adds work, shrinks a chunk deep into a long
   prompt to what the time left allows, and starts no request while the running set's
   decodes take more than half the step (wait reason `step_time`). Tokens alone
   cannot do this: a 128-token chunk at position 4k costs ~4x one at position 0, a decode
   over a 2k context ~15x a decode over 128 tokens.

Where the fixed cost alone nearly fills the target (a slow or busy device), the target is
out of reach; budgets cut down to a few tokens would then spend most of each step on the
fixed cost and run far fewer tokens per second. So a step is never sized below the
tokens whose cost equals the fixed cost (the fixed cost at most half the step), and the
note says the target is missed. The fit only ever lowers the built-in defaults
(2048 / 8192): a device fast enough keeps them. A value the operator set is kept as given;
the budget is then never fitted below their chunk. With `chunked_prefill` off, or both
budgets set, nothing is fitted and no law is measured (the budgets are the operator's).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from engine.calibration.probe import MIN_CHUNK, StepProber, measure
from engine.calibration.step_law import StepLaw, StepProbe, fit_law, law_error_pct
from engine.config import EngineConfig, LiveConfig

FITTED_FIELDS = ("prefill_chunk_size", "max_num_batched_tokens")
CHUNK_SHARE = 2 / 3  # of one step's tokens, for the prefill chunk; the rest for decodes


@dataclass(frozen=True)
class StepFit:
    """What was fitted, from what measurement, and why."""

    target_step_ms: int
    probes: tuple[StepProbe, ...]  # the measured steps
    law: StepLaw
    step_tokens: int  # tokens of a first chunk one step may run within the target
    fitted: dict[str, int]  # field -> value chosen (only those the operator left unset)
    kept: dict[str, int]  # field -> the operator's value, not fitted
    note: str = ""  # e.g. the target is unreachable

    @property
    def points(self) -> tuple[tuple[int, float], ...]:
        """(tokens, seconds) of the prefill probes from position 0."""
        return tuple((p.tokens, p.seconds) for p in self.probes
                     if p.decode_context == 0 and p.label.endswith("@0"))

    def predicted_ms(self, tokens: int) -> float:
        """A step of one prompt's first `tokens`-token chunk, by the law."""
        return 1000.0 * (self.law.fixed_s + self.law.chunk_s(0, tokens))

    def summary(self) -> str:
        """One line for the ready banner."""
        chosen = ", ".join(f"{k}={v}" for k, v in self.fitted.items())  # never empty: needs_fit
        law = self.law
        measured = (f"measured {1000 * law.fixed_s:.3g} ms + {1000 * law.token_s:.3g}"
                    f" ms/token + {1e6 * law.decode_kv_s:.3g} us per decode context token;"
                    f" decodes alone {1000 * law.decode_fixed_s:.3g} ms +"
                    f" {1000 * law.decode_row_s:.3g} ms/decode")
        # the operator's values apart: "fitted to" them would say the fit chose them
        kept = (f"; set in config: {', '.join(f'{k}={v}' for k, v in self.kept.items())}"
                if self.kept else "")
        note = f"; {self.note}" if self.note else ""
        return (f"budgets: {chosen} fitted to {self.target_step_ms} ms steps ({measured})"
                f"{kept}{note}")

    def to_dict(self) -> dict:
        return {"target_step_ms": self.target_step_ms, "fitted": dict(self.fitted),
                "kept": dict(self.kept), "law": self.law.to_dict(),
                "law_max_error_pct": round(law_error_pct(self.law, list(self.probes)), 1),
                "step_tokens": self.step_tokens,
                "probes": [{"step": p.label, "ms": round(1000 * p.seconds, 3),
                            "predicted_ms": round(1000 * self.law.step_s(*p.features), 3)}
                           for p in self.probes],
                "rule": "max_num_batched_tokens = the tokens of a first chunk one step runs"
                        " within the target by the law (never fewer than the fixed cost's"
                        " worth) and at least 3/2 of the chunk; prefill_chunk_size = the"
                        " largest power of two <= 2/3 of them; neither above the built-in"
                        " default. Each step is also held to 90% of the target by the law"
                        " (scaled by measured / predicted): chunks deep into long prompts"
                        " shrink, and no request starts while the running set's decodes"
                        " take more than half the step (wait reason step_time)",
                "summary": self.summary(), "note": self.note}


def needs_fit(config: EngineConfig, explicit: set[str]) -> bool:
    return (config.static.target_step_ms > 0 and config.live.chunked_prefill
            and not set(FITTED_FIELDS) <= explicit)


def fit_step_budgets(config: EngineConfig, explicit: set[str], prober: StepProber,
                     ) -> tuple[EngineConfig, StepFit | None]:
    """`config` with the budgets the operator did not set fitted to steps measured by
    `prober`, and the record of the fit (its law included); (config, None) when nothing
    is to be fitted (see `needs_fit`)."""
    if not needs_fit(config, explicit):
        return config, None
    static, live = config.static, config.live
    target_s = static.target_step_ms / 1000
    pool = static.num_kv_blocks * static.block_size
    max_context = min(static.max_model_len, pool)
    probes = measure(prober, target_s, max_tokens=min(live.prefill_chunk_size, max_context),
                     max_context=max_context, pool_tokens=pool, max_batch=live.max_num_seqs,
                     block_size=static.block_size)
    law = fit_law(probes)
    step_tokens = max(law.affordable_chunk(0, target_s - law.fixed_s),
                      law.affordable_chunk(0, law.fixed_s))
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
    fit = StepFit(static.target_step_ms, tuple(probes), law, step_tokens, fitted, kept)
    return EngineConfig(static, live.replace(**fitted)).validate(), _noted(fit, budget, live)


def _noted(fit: StepFit, budget: int, live: LiveConfig) -> StepFit:
    """`fit` with its note: the target missed (first: kept defaults can miss it too, when
    the probes priced every size alike), or the defaults already fitting it."""
    predicted = fit.predicted_ms(budget)
    if predicted > fit.target_step_ms:
        note = f"a {budget}-token step is predicted at {predicted:.0f} ms, over the target"
        if fit.law.token_s == 0 and fit.law.prefill_pair_s == 0:
            # more tokens cost nothing more: the probes timed whatever else held the CPU
            note += (f"; the probe steps took {1000 * fit.law.fixed_s:.0f} ms at every"
                     " size, so they ran beside other work and this law is not the"
                     " device's: restart on a quiet machine, or set the budgets")
        return _with_note(fit, note)
    if all(v == getattr(live, k) for k, v in fit.fitted.items()):
        return _with_note(fit, "the built-in defaults already fit the target")
    return fit


def _pow2_floor(x: float) -> int:
    return 1 << int(math.floor(math.log2(x))) if x >= 1 else 1


def _with_note(fit: StepFit, note: str) -> StepFit:
    return dataclasses.replace(fit, note=note)
