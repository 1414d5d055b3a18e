"""Sanity checks of the smoke figures of the Ray fleet's benchmarks.

tests/bench/test_bench_smoke.py runs each smoke and calls CHECKS[its name] on its JSON line.
Each check asserts what the run must have done and that its figures are finite and in
range; never a speed goal (a tiny model beside the rest of make test)."""

from __future__ import annotations

import math

import pytest


def check_fleet_autoscale(result: dict) -> None:
    """The burst scaled 1 -> 2 after the configured delay (not before it: the delay is
    real), the idle spell back to 1 after its own, replica 1 served part of the burst, and
    every request sent ended well, each one a row of a replica's trace (none lost)."""
    assert result["up_delay_s"] <= result["scale_up_s"] < result["ready_s"], result
    assert result["down_delay_s"] <= result["scale_down_s"] <= result["off_s"], result
    # each fired once its want had held the delay: not before (the delay is real), and the
    # policy acted on it within a few ticks and publishes (not a correctness bound: lax)
    for side in ("up", "down"):
        delay, waited = result[f"{side}_delay_s"], result[f"{side}_waited_s"]
        assert delay <= waited < delay + 5.0, result
    assert result["failed"] == 0 and result["ok"] == result["sent"] > 0, result["failures"]
    assert result["by_replica"].get("1", 0) > 0, result["by_replica"]
    assert result["trace_total"] == result["sent"], result["trace_rows"]
    events = [(e["event"], e["replica_id"]) for e in result["events"]]
    assert events == [("scale_up", 1), ("ready", 1), ("scale_down", 1), ("stopped", 1)]
    # replica 0 was live for both: its trace recorded each as an audit row
    assert result["trace_audit"]["replica-0"] == ["autoscale_scale_up",
                                                  "autoscale_scale_down"], result["trace_audit"]


def check_fleet_routing(result: dict) -> None:
    """Every router ran its round; the oracle routed on blocks it found held (the
    ingress's keys matched the replicas' own: broken hashing would leave it 0); the KV
    index learnt blocks from the events in every round (a broken feed: 0). Precise
    decisions themselves are timing: on a fast CPU a smoke round's 16 requests can end
    before the first events arrive. The figures are rates and positive latencies."""
    assert result["workload"] == "cache-pressure" and result["restart"] is True
    for mode in ("precise", "oracle", "affinity", "random"):
        assert 0.0 <= result[f"{mode}_prefix_hit_rate"] <= 1.0
        assert 0.0 < result[f"{mode}_ttft_p50_s"] <= result[f"{mode}_ttft_p99_s"] < 60
        # pooled over the rounds it is at least the smallest round's p99
        assert (result[f"{mode}_ttft_p99_s_range"][0] <= result[f"{mode}_ttft_p99_pooled_s"]
                < 60)
    # the pool was sized under the workload's live prefixes: there is pressure
    assert 0 < result["kv_blocks"] < result["live_blocks"], result
    assert set(result["ratios"]) >= {"prefix_hit_rate:precise/oracle",
                                     "ttft_p99_s:precise/affinity",
                                     "ttft_p99_pooled_s:precise/affinity"}
    assert all(0 < r < math.inf for r in result["ratios"].values())
    assert result["oracle_decisions"].get("precise", 0) > 0, result["oracle_decisions"]
    for mode in ("precise", "oracle", "affinity", "random"):
        assert result[f"{mode}_indexed_blocks"] > 0, result
    assert "precise" not in result["affinity_decisions"]
    # each document is asked for several times a round: a cache in use at all
    assert result["oracle_prefix_hit_rate"] > 0.2


def _spread_ok(spread: dict, n: int) -> bool:
    """A {median, min, max, n} summary over n runs: ordered, finite, non-negative."""
    return (spread["n"] == n and 0 <= spread["min"] <= spread["median"] <= spread["max"]
            and math.isfinite(spread["max"]))


def check_fleet_control(result: dict) -> None:
    """Every pair changed the config on an idle and on a loaded fleet (each change
    converged: the bench asserts it), the client's round trip no shorter than the
    convergence it waited for; both canaries decided, each decision matching its reason and
    each side's figures in range. Which way a canary went is timing: printed, not asserted
    (the quiet Ray test asserts the rollback)."""
    pairs = result["pairs"]
    for mode in ("idle", "loaded"):
        converge, trip = result[f"{mode}_converge_ms"], result[f"{mode}_round_trip_ms"]
        assert _spread_ok(converge, pairs) and _spread_ok(trip, pairs), (mode, result)
        assert converge["max"] > 0, (mode, converge)
        # each change's round trip holds its convergence, so every order statistic does
        assert all(trip[k] >= converge[k] for k in ("min", "median", "max")), (mode, result)
    for name, value in (("canary_bad", "1"), ("canary_good", "64")):
        run = result[name]
        assert run["change"] == f"max_num_seqs -> {value}", run
        prefix = {"rolled_back": ("regression:", "inconclusive:"),
                  "promoted": ("no regression",)}[run["decision"]]
        assert run["why"].startswith(prefix), run
        assert 0 < run["decided_after_s"] < 10 * result["watch_s"], run
        for side in ("canary", "baseline"):
            got = run[side]
            assert 0 <= got["error_rate"] <= 1 and 0 <= got["goodput_share"] <= 1, run
            if got["requests"]:
                assert 0 < got["ttft_p99_s"] < math.inf, run
        if run["decision"] == "promoted":  # promoted only with enough requests each side
            assert min(run["canary"]["requests"], run["baseline"]["requests"]) >= 5, run


def check_fleet_scaling(result: dict) -> None:
    """Both fleets (1 replica with every core, 2 with half each) ran their burst and the
    run at C1 with no request failed, every request routed to a replica the fleet has;
    figures finite and ordered; each B/A ratio the quotient of its sides (one pair)."""
    pairs, cores, sides = result["pairs"], result["cores"], result["sides"]
    assert (sides["A"]["replicas"], sides["B"]["replicas"]) == (1, 2), sides
    assert sides["A"]["replica_cpus"] == cores and sides["B"]["replica_cpus"] == cores / 2
    for side, got in sides.items():
        assert got["failed"]["max"] == 0, (side, got)
        for key in ("capacity_rps", "request_rps", "output_tps", "ttft_p50_ms", "tpot_p50_ms"):
            assert _spread_ok(got[key], pairs) and got[key]["min"] > 0, (side, key, got)
        assert got["ttft_p50_ms"]["max"] <= got["ttft_p99_ms"]["max"], (side, got)
        assert got["tpot_p50_ms"]["max"] <= got["tpot_p99_ms"]["max"], (side, got)
        for split in result["splits"][side]:
            for run, routed in split.items():
                # the load tester's one /v1/models lookup is routed too
                assert sum(routed.values()) == result["requests"] + 1, (side, run, routed)
                assert set(routed) <= {str(i) for i in range(got["replicas"])}, routed
    a_caps = sides["A"]["capacity_rps"]
    assert a_caps["min"] <= result["c1_rps"] <= a_caps["max"], result
    ratios = result["ratios"]
    assert all(_spread_ok(r, pairs) and r["min"] > 0 for r in ratios.values()), ratios
    if pairs == 1:
        for key in ("request_rps", "output_tps", "ttft_p50_ms", "tpot_p50_ms"):
            quotient = sides["B"][key]["median"] / sides["A"][key]["median"]
            assert ratios[f"{key}_b_over_a"]["median"] == pytest.approx(quotient, rel=0.02)
        quotient = sides["B"]["capacity_rps"]["median"] / a_caps["median"]
        assert ratios["c2_over_c1"]["median"] == pytest.approx(quotient, rel=0.02)


CHECKS = {
    "fleet_autoscale": check_fleet_autoscale,
    "fleet_routing": check_fleet_routing,
    "fleet_control": check_fleet_control,
    "fleet_scaling": check_fleet_scaling,
}
