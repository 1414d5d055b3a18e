"""A fault-injecting executor: wraps an executor and fails the steps a test chooses.

    faulty = FaultyExecutor(engine.executor)
    faulty.add(Fault(steps={3}))                               # execute raises in step 3
    faulty.add(Fault(match=lambda r: r.tenant == "poison"))    # ... when such a request runs
    faulty.add(Fault(match=..., prefill_only=True))            # ... in a prompt chunk (an OOM
                                                               # on a large prefill)
    faulty.add(Fault(steps={5}, mode="corrupt"))               # the last sample row's token is
                                                               # unusable: update() raises
                                                               # after applying earlier rows
    faulty.add(Fault(when=lambda out: len(out.decodes) > 3))   # a batch of this shape fails

A "raise" fault fires on every executor call it matches, at most `times` times (a step or
batch fault: every call of that step or shape). The engine retries parts of a failed step,
so a request-matched fault then fails only the parts holding that request. A "corrupt"
fault runs the inner executor and replaces the tokens of the matched sample rows (of the
last row, for a step or batch fault) with a CorruptToken, which raises InjectedFault
wherever it is used as a token id: update() fails part-way, after the rows before it were
applied (some may have finished).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.records import SchedulerOutput
from engine.request import Request

MODES = ("raise", "corrupt")


class InjectedFault(RuntimeError):
    """Raised by a FaultyExecutor: the simulated device failed."""


class CorruptToken:
    """A sampled "token" that raises when update() compares, hashes or indexes it."""

    def _fail(self, *args: Any) -> Any:
        raise InjectedFault("corrupt sampled token")

    __hash__ = __eq__ = __int__ = __index__ = __lt__ = _fail  # type: ignore[assignment]


@dataclass
class Fault:
    """When to fail (a step id, or a request of the batch matching) and how."""

    match: Callable[[Request], bool] | None = None  # a request of the call matches
    steps: frozenset[int] = frozenset()  # or the call is of one of these step ids
    when: Callable[[SchedulerOutput], bool] | None = None  # or the call's batch matches
    mode: str = "raise"  # raise: execute raises; corrupt: update() raises
    prefill_only: bool = False  # match only requests running a prompt chunk
    times: int | None = None  # fire at most this many times (None: every time)
    error: Callable[[str], Exception] = InjectedFault
    fired: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} must be one of {MODES}")
        if self.match is None and not self.steps and self.when is None:
            raise ValueError("a Fault needs `match`, `steps` or `when`")
        self.steps = frozenset(self.steps)

    def matched(self, out: SchedulerOutput) -> list[Request] | None:
        """The requests that trigger it in this call ([] for a step fault); None: no."""
        if self.times is not None and self.fired >= self.times:
            return None
        if out.step_id in self.steps or (self.when is not None and self.when(out)):
            return []
        if self.match is None:
            return None
        reqs = [c.request for c in out.prefills]
        if not self.prefill_only:
            reqs = list(out.decodes) + reqs
        hits = [r for r in reqs if self.match(r)]
        return hits or None


class FaultyExecutor:
    """An executor that fails as its faults say and otherwise runs `inner`."""

    def __init__(self, inner: Any, *faults: Fault):
        self.inner = inner
        self.faults: list[Fault] = list(faults)
        self.calls = 0  # execute() calls, failed or not
        self.fired: list[tuple[int, str]] = []  # (step id, mode) of each fault that fired

    def add(self, fault: Fault) -> Fault:
        self.faults = [*self.faults, fault]  # one assignment: safe to call from a test thread
        return fault

    def clear(self) -> None:
        self.faults = []

    def __getattr__(self, name: str) -> Any:  # the inner executor's other methods
        return getattr(self.inner, name)

    def execute(self, out: SchedulerOutput) -> list[int]:
        self.calls += 1
        for fault in self.faults:
            hits = fault.matched(out)
            if hits is None:
                continue
            fault.fired += 1
            self.fired.append((out.step_id, fault.mode))
            if fault.mode == "raise":
                names = ", ".join(r.request_id for r in hits) or "its batch"
                raise fault.error(f"injected fault in step {out.step_id} ({names})")
            return _corrupt(out, self.inner.execute(out), hits)
        return self.inner.execute(out)


def _corrupt(out: SchedulerOutput, sampled: list[Any], hits: list[Request]) -> list[Any]:
    rows = out.sample_requests()
    if not hits:  # a step fault: the last row, so the rows before it are applied first
        return sampled[:-1] + [CorruptToken()] if sampled else sampled
    bad = set(map(id, hits))
    return [CorruptToken() if id(req) in bad else token for req, token in zip(
        rows, sampled, strict=True)]
