"""A lane's service-level objective: the latency its requests must meet to count as goodput.

    ttft_s   seconds from arrival to the first token (None: no target)
    tpot_s   seconds per output token after the first, the request's mean (None: no target)

A request meets its SLO when every target its lane sets holds; goodput is such requests
per second. The scheduler sizes steps against the targets (engine/scheduling/goodput.py),
admission sheds a request whose TTFT target the queue ahead of it already rules out
(engine/lanes/admission.py, reason `slo_unreachable`), and the load tester, what-if and
canary count goodput by the same targets unless told others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.config.known_keys import check_known_keys

MAX_SLO_S = 3600.0  # a target beyond an hour is a typo, not an objective
SLO_KEYS = ("ttft_s", "tpot_s")


@dataclass(frozen=True)
class LaneSLO:
    ttft_s: float | None = None
    tpot_s: float | None = None

    @property
    def is_set(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def validate(self, where: str) -> None:
        for key in SLO_KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or not 0 < value <= MAX_SLO_S):
                raise ValueError(f"{where}.{key}={value!r} must be a number of seconds in"
                                 f" (0, {MAX_SLO_S:g}], or null for no target")

    def met(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        """Whether a finished request's latencies meet every target (a missing TTFT never
        does; a missing TPOT, one output token, meets any)."""
        if self.ttft_s is not None and (ttft_s is None or ttft_s > self.ttft_s):
            return False
        return self.tpot_s is None or tpot_s is None or tpot_s <= self.tpot_s

    def describe(self, sep: str = ", ", none: str = "no SLO") -> str:
        """"TTFT 5 s, TPOT 0.5 s" (the targets set), or `none`."""
        parts = [f"{name} {value:g} s" for name, value in (("TTFT", self.ttft_s),
                                                          ("TPOT", self.tpot_s))
                 if value is not None]
        return sep.join(parts) or none

    def to_dict(self) -> dict[str, float | None]:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}

    @classmethod
    def parse(cls, value: Any, where: str) -> LaneSLO:
        """From YAML or JSON: a mapping of ttft_s and/or tpot_s, or null (no targets)."""
        if isinstance(value, LaneSLO):
            return value
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a mapping of ttft_s and tpot_s (seconds)")
        check_known_keys(where, value, SLO_KEYS)
        slo = cls(**value)
        slo.validate(where)
        return slo
