"""Sanity checks of the smoke figures of the server's benchmarks (latency, traces, hostile).

tests/bench/test_bench_smoke.py runs each smoke and calls CHECKS[its name] on its JSON line.
Each check asserts what the run must have done and that its figures are finite and in
range; never a speed goal (a tiny model beside the rest of make test)."""

from __future__ import annotations

import math

import pytest


def check_serving_path(result: dict) -> None:
    """Both sides generated every token of the workload (the server refused and failed
    none: a smoke round is far from its SLOs), at positive rates; the ratio is their
    medians' quotient. No bound on its size: a smoke round is tens of milliseconds of a
    tiny model, fixed costs and stalls, not a speed figure (CI once saw 25 when another
    smoke starved the offline side)."""
    assert result["refused"] == 0 and result["failed"] == 0, result
    assert result["tokens"]["server"] == result["tokens"]["offline"], result
    assert result["tokens"]["server_httpx"] == result["tokens"]["offline"], result
    for side in ("offline", "server", "server_httpx"):
        low, high = result[side]["range"]
        assert 0 < low <= result[side]["median_tok_s"] <= high < math.inf, result
    quotient = result["server"]["median_tok_s"] / result["offline"]["median_tok_s"]
    assert result["server_over_offline"] == pytest.approx(quotient, rel=1e-2), result
    assert min(result["per_round_ratio"]) <= result["server_over_offline"] * 1.01
    assert max(result["per_round_ratio"]) >= result["server_over_offline"] * 0.99
    assert len(result["per_round_ratio"]) == result["rounds"]


def check_trace_overhead(result: dict) -> None:
    """Every mode ran; the OTLP ones exported spans (to the sink process) and lost none;
    the ratio 0.1 exported fewer than every request."""
    for side in ("gpu_like", "cpu_bound"):
        run = result[side]
        assert set(run["steps_per_s"]) == {"off", "metrics", "trace", "otlp", "otlp_0.1"}
        assert all(v > 0 for v in run["steps_per_s"].values()), run
        assert run["spans_exported"] > 0 and run["spans_dropped"] == 0, run
        assert run["rows_dropped"] == 0, run


def check_poison_phase(poison: dict) -> None:
    """The poison phase's figures are sane, and its goals hold: they are correctness (no
    5xx, no innocent disturbed, each malformed request answered as expected), not speed.
    The TPOT ratio is printed by the bench, never asserted."""
    for key in ("poison_sent", "innocents", "five_xx", "innocents_disturbed",
                "baseline_unstable", "poison_failures"):
        assert isinstance(poison[key], int) and poison[key] >= 0, key
    assert poison["poison_sent"] > 0 and poison["innocents"] > 0
    assert set(poison["poison_by_kind"]) == set(poison["poison_cases"]), "every kind sent"
    for side, timing in poison["tpot_p99_ms"].items():
        for phase in ("A", "B"):
            values = timing["phases"][phase]
            assert len(values) == poison["rounds"], (side, phase)
            assert all(math.isfinite(v) and v > 0 for v in values), (side, phase, values)
        assert math.isfinite(timing["b_over_a"]) and timing["b_over_a"] > 0, side
    assert poison["five_xx"] == 0, poison["failures"]
    assert poison["innocents_disturbed"] == 0, poison["disturbed"]
    assert poison["poison_failures"] == 0, poison["failures"]


def check_hostile_traffic(result: dict) -> None:
    check_poison_phase(result["poison"])


DASHBOARD_PAGES = ("overview", "scheduler", "requests", "control")  # dashboard/views/*.py


def check_dashboard_load(result: dict) -> None:
    """Every page rendered (the bench fails on a page's exception) in both windows over the
    smoke's hour of trace, each in a finite positive time; the 2 s goal is never asserted."""
    assert result["smoke"] is True and result["seconds_of_trace"] == 3600, result
    rendered = {f"{page} {window}" for page in DASHBOARD_PAGES for window in ("all", "1 h")}
    assert set(result["load_s"]) == rendered, result["load_s"].keys()
    assert all(0 < s < math.inf for s in result["load_s"].values()), result["load_s"]


def _check_dist(dist: dict, n: int, positive: bool = True) -> None:
    """A latency_reconcile distribution of n samples: finite, p50 <= p99 <= max."""
    assert dist["n"] == n, (dist, n)
    if n:
        assert all(math.isfinite(dist[k]) for k in ("p50", "p99", "max")), dist
        assert dist["p50"] <= dist["p99"] <= dist["max"], dist
        assert not positive or dist["p50"] > 0, dist


def check_latency_reconcile(result: dict) -> None:
    """This tree only: both blocked rounds timed on both sides, every replayed request ok,
    the trace holding each request sent (2 per round, the replay's); gaps (client - server)
    are finite, their sign and size printed, never asserted."""
    assert set(result) == {"bench", "smoke", "this tree"}, result.keys()
    tree = result["this tree"]
    blocked, rounds = tree["blocked"], len(tree["blocked"]["rounds"])
    assert rounds == 2, blocked  # bench.latency_reconcile's SMOKE
    for key in ("client_ttft_s", "server_ttft_s", "server_queue_delay_s"):
        _check_dist(blocked[key], rounds)
    # 0 when the long prompt (300 tokens in a smoke) was answered before the short was sent
    _check_dist(blocked["client_blocked_s"], rounds, positive=False)
    _check_dist(blocked["ttft_gap_s"], rounds, positive=False)
    assert all(r["long_e2e_s"] > 0 and r["request_id"] for r in blocked["rounds"]), blocked
    replay = tree["replay"]
    assert replay["ok"] == replay["sent"] == 6, replay  # SMOKE's requests
    _check_dist(replay["client_ttft_s"], replay["ok"])
    # the server's figures: on every stream's finish chunk; the TTFT gap also needs a
    # chunk with text, which a tiny random model's tokens may not decode to
    _check_dist(replay["server_ttft_s"], replay["ok"])
    _check_dist(replay["e2e_gap_s"], replay["ok"], positive=False)
    assert replay["ttft_gap_s"]["n"] <= replay["ok"], replay
    _check_dist(replay["ttft_gap_s"], replay["ttft_gap_s"]["n"], positive=False)
    waits = tree["trace_waits"]
    assert waits["requests"] == 2 * rounds + replay["sent"], waits
    assert waits["steps"] > 0 and waits["step_s"]["n"] == waits["steps"], waits
    _check_dist(waits["step_s"], waits["steps"])
    assert 0 <= waits["steps_over_target"] <= waits["steps"], waits
    assert all(0 <= s < math.inf for s in waits["by_reason_s"].values()), waits
    assert 0 <= waits["queue_delay_total_s"] < math.inf, waits
    # measured / predicted steps: none where the trace has no step the law predicted
    ratios = waits["measured_over_predicted"]
    assert ratios["n"] <= waits["steps"], waits
    _check_dist(ratios, ratios["n"])


# operations the fuzzer must reach whatever routes are added; POST /control/drain is left
# out by the bench (it makes every later generation a 503 by design)
FUZZED_CORE = {"POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize",
               "POST /detokenize", "PATCH /control/config", "POST /v1/whatif",
               "GET /v1/models", "GET /metrics", "GET /health"}


def check_openapi_fuzz(result: dict) -> None:
    """No case got a 5xx, hung or made the server log an exception (the bench's point);
    the core operations were fuzzed, those with inputs with positive and negative cases (at
    least 2), and nearly every case reached the server."""
    assert result["failures"] == [], result["failures"]
    per_operation = result["cases_per_operation"]
    assert set(per_operation) >= FUZZED_CORE, FUZZED_CORE - set(per_operation)
    assert "POST /control/drain" not in per_operation, per_operation
    assert result["operations"] == len(per_operation), result
    assert result["cases"] == sum(per_operation.values()), result
    assert all(n >= 1 for n in per_operation.values()), per_operation
    assert all(per_operation[op] >= 2 for op in FUZZED_CORE if not op.startswith("GET")), \
        per_operation
    assert 0 <= result["unsendable"] * 10 <= result["cases"], result  # the client's refusals
    assert 0 < result["seconds"] < math.inf, result


CHECKS = {
    "serving_path": check_serving_path,
    "trace_overhead": check_trace_overhead,
    "hostile_traffic": check_hostile_traffic,
    "dashboard_load": check_dashboard_load,
    "latency_reconcile": check_latency_reconcile,
    "openapi_fuzz": check_openapi_fuzz,
}
