"""One step's time budget: the step law's prediction of the step so far, against the target.

When the engine has a step law (engine/calibration/step_law.py, measured at start-up by
engine/calibration/budget_fit.py), each step starts with `target_s - fixed_s` seconds and
the scheduler charges its work as it adds it (tokens alone cannot say what a step costs: a
chunk deep into a long prompt, or a decode over a long context, costs many times a token
of a prompt's first chunk). Three rules use it:

- decodes of running requests always run (a stream is never paused for time); they are
  charged, and what is left goes to prompt chunks;
- a prompt chunk is cut to the tokens the time left allows (`chunk_room`), but the first
  chunk of a step gets at least MIN_PROGRESS tokens, so a started prompt always advances;
- a request starts only while the running set's decodes (each at its current length)
  stay within DECODE_SHARE of the step (`admits`; else wait reason `step_time`), so the
  decodes alone never fill the steps and starve every prompt. Its own decodes are not
  counted against it: one long prompt may overshoot the share by its own decode cost, where
  counting it would hold a long prompt back until nothing runs (the long-prompt replay ran
  a third fewer requests that way).

The law is fitted to the model runner's execute alone, on an idle machine; a served step
also schedules, samples and updates, beside an event loop. So each step aims at HEADROOM of
the target, divided by `LawSlowdown`: the moving average of measured / predicted step time,
never below 1 (a law that over-predicts is left as it is: budgets are not loosened past it).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.calibration.step_law import StepFeatures, StepLaw, chunk_pairs
from engine.request import Request

DECODE_SHARE = 0.5  # of (target - fixed): the most the running set's decodes may take
MIN_PROGRESS = 16  # tokens the first prompt chunk of a step gets, whatever the time left
HEADROOM = 0.9  # of the target: what a step aims at by the (scaled) law
SCALE_WEIGHT = 0.05  # of each step in the moving average of measured / predicted
MAX_SCALE = 4.0


@dataclass(slots=True)
class StepTime:
    """One step's work charged so far, as the law's features, against its target; the
    time left and the prediction follow from them (one account, never two)."""

    law: StepLaw
    target_s: float
    decode_share_s: float
    running_decode_s: float | None = None  # summed at the first start tried this step
    # the law's features of the work charged (StepFeatures): tokens, decodes among them,
    # prefill pairs, decode context
    tokens: int = 0
    decodes: int = 0
    pairs: int = 0
    context: int = 0

    @classmethod
    def start(cls, law: StepLaw, target_s: float) -> StepTime:
        return cls(law, target_s, DECODE_SHARE * (target_s - law.fixed_s))

    @property
    def features(self) -> StepFeatures:
        """(tokens, decodes, prefill pairs, decode context) of the work charged."""
        return self.tokens, self.decodes, self.pairs, self.context

    @property
    def predicted_s(self) -> float:
        """The law's time of the work charged so far (the fixed cost included)."""
        return self.law.step_s(self.tokens, self.decodes, self.pairs, self.context)

    @property
    def left_s(self) -> float:
        """The time a prompt chunk may take: the step priced as one with a chunk, which
        it becomes once one joins (a step of decodes alone costs less on its own)."""
        return self.target_s - self.law.with_prompt_s(self.tokens, self.pairs, self.context)

    def take_decodes(self, num_decodes: int, context: int) -> None:
        """Charge `num_decodes` decodes attending `context` KV tokens in all."""
        self.tokens += num_decodes
        self.decodes += num_decodes
        self.context += context

    def take_chunk(self, start: int, num_tokens: int) -> None:
        self.tokens += num_tokens
        self.pairs += chunk_pairs(start, num_tokens)

    def give_back(self, decode_context: int | None, chunks: list[tuple[int, int]]) -> None:
        """Return what an unscheduled request had taken: its decode (context) and/or its
        chunks ((start, tokens) each)."""
        if decode_context is not None:
            self.tokens -= 1
            self.decodes -= 1
            self.context -= decode_context
        for start, num_tokens in chunks:
            self.tokens -= num_tokens
            self.pairs -= chunk_pairs(start, num_tokens)

    def chunk_room(self, start: int, first_chunk: bool) -> int:
        """Tokens a chunk from `start` may run in the time left (>= MIN_PROGRESS for the
        step's first chunk)."""
        room = self.law.affordable_chunk(start, self.left_s)
        return max(room, MIN_PROGRESS) if first_chunk else room

    def admits(self, req: Request, running: list[Request]) -> bool:
        """Whether the running set's decodes (those started this step included) leave
        room within the decode share; True when nothing runs."""
        if not running:
            return True
        law = self.law
        if self.running_decode_s is None:
            self.running_decode_s = (law.token_s * len(running) + law.decode_kv_s
                                     * sum(len(r.token_ids) for r in running))
        return self.running_decode_s <= self.decode_share_s

    def started(self, req: Request) -> None:
        if self.running_decode_s is not None:
            self.running_decode_s += self.law.decode_s(req.num_tokens)


@dataclass(slots=True)
class LawSlowdown:
    """How much longer served steps run than the law predicts: a moving average of
    measured / predicted (engine clock), in [1, MAX_SCALE]."""

    value: float = 1.0

    def observe(self, predicted_s: float | None, measured_s: float) -> None:
        if predicted_s is None or predicted_s <= 0 or measured_s <= 0:
            return
        ratio = min(max(measured_s / predicted_s, 1.0), MAX_SCALE)
        self.value += SCALE_WEIGHT * (ratio - self.value)

    def step_target_s(self, target_s: float) -> float:
        """The time a step aims at by the law: HEADROOM of the target, scaled."""
        return HEADROOM * target_s / self.value
