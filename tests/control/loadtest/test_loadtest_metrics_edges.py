"""Load-test summary numbers at their edges (control/loadtest/metrics.py), on requests made
here rather than the recorded run of test_loadtest_metrics.py (whose TPOTs sit on no target
and whose server usage matches every planned length): a TPOT exactly at its target, and
prompt tokens as the server counted them."""

from __future__ import annotations

import pytest

from control.loadtest.metrics import summarize, tpot_s
from control.loadtest.records import SLO, PlannedRequest, RequestResult

approx = pytest.approx


def _ok(index: int, *, planned_prompt: int = 100, usage_prompt: int = 100, output: int = 3,
        ttft_s: float = 0.5, e2e_s: float = 1.0) -> RequestResult:
    """A streamed ok request; its chunks are evenly spread from its TTFT to its E2E."""
    planned = PlannedRequest(index, 0.0, planned_prompt, output, "acme", None, True, None)
    step = (e2e_s - ttft_s) / max(output - 1, 1)
    return RequestResult(planned, "ok", 200, ttft_s=ttft_s, e2e_s=e2e_s,
                         chunk_times_s=[ttft_s + i * step for i in range(output)],
                         prompt_tokens=usage_prompt, output_tokens=output)


def test_a_tpot_exactly_at_its_target_meets_it():
    # (1.0 - 0.5) / (3 - 1) = 0.25 and (1.1 - 0.5) / 2 = 0.3: both exact in binary,
    # so "at the target" is not a rounding question
    at, over = _ok(0), _ok(1, e2e_s=1.1)
    assert (tpot_s(at), tpot_s(over)) == approx((0.25, 0.3))
    s = summarize([at, over], 2.0, SLO(tpot_s=0.25))
    assert (s.slo_met, s.slo_met_share, s.goodput_rps) == (1, approx(0.5), approx(0.5))


def test_prompt_tokens_are_the_servers_count_and_the_planned_length_only_without_usage():
    """The server's usage counts what it tokenized (a chat template adds tokens to the
    planned text): that is the prompt work total_tps reports. A reply without usage falls
    back to the planned length."""
    templated = _ok(0, planned_prompt=100, usage_prompt=117)
    no_usage = _ok(1, planned_prompt=50, usage_prompt=0)
    s = summarize([templated, no_usage], 2.0, None)
    assert s.prompt_tokens == 167  # 117 (usage) + 50 (planned: no usage)
    assert s.total_tps == approx((167 + 6) / 2.0)  # 3 output tokens each
