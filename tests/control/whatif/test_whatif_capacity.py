"""Capacity planning in the what-if: the recorded arrivals at a multiple of their rate
(--rate-scale, rate_scale), and a sweep of rates (--rate-sweep, rate_sweep) with goodput
and p99 TTFT against rate, each config's capacity, a table and a plot; bad rates refused
with exit 2 / 400 naming the flag or field."""

from __future__ import annotations

import json

import pytest
from whatif_sim_trace import START, read_trace_window, record

from control.api.errors import APIError
from control.cli.main import main
from control.whatif.capacity import MAX_SWEEP_RATES, scale_window
from control.whatif.report import CAPACITY_COLUMNS, capacity_lines
from control.whatif.routes import parse_rates
from engine.config import LiveConfig

SLO = ["--slo-ttft", "0.5"]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("capacity") / "trace.duckdb")
    record(path, LiveConfig(max_num_seqs=8, max_num_batched_tokens=256,
                            prefill_chunk_size=128), n=80, rate_per_s=4.0, cancel_every=9)
    return path


def test_a_scaled_window_is_the_same_requests_denser(db):
    window = read_trace_window(db)
    assert scale_window(window, 1.0) is window
    fast = scale_window(window, 2.0)
    assert fast.duration_s == pytest.approx(window.duration_s / 2)
    for before, after in zip(window.requests, fast.requests, strict=True):
        assert after.arrival_time - window.since == pytest.approx(
            (before.arrival_time - window.since) / 2)
        assert (after.num_prompt_tokens, after.num_output_tokens, after.tenant) == (
            before.num_prompt_tokens, before.num_output_tokens, before.tenant)
        if before.finished_time is not None:  # a cancel keeps its delay after arrival
            assert after.finished_time - after.arrival_time == pytest.approx(
                before.finished_time - before.arrival_time)


def test_a_window_asked_wider_than_its_traffic_spans_the_traffic(db):
    """`--since -1h` over a short load test: rates (goodput, a sweep's offered rate) are
    per second of traffic, as the loadtest counts them, not per second of the hour asked
    (they read ~60x low once)."""
    whole = read_trace_window(db)
    wide = read_trace_window(db, since=START - 3600, until=START + 7200)
    assert (wide.since, wide.until) == (whole.since, whole.until)
    assert whole.since == whole.requests[0].arrival_time > START
    assert whole.until == max(r.finished_time or r.arrival_time for r in whole.requests)
    assert len(whole.requests) / whole.duration_s == pytest.approx(4.0, rel=0.35)
    cut = read_trace_window(db, since=START, until=START + 5)  # ends inside the traffic
    assert cut.until == START + 5 and cut.since == cut.requests[0].arrival_time


def test_rate_scale_puts_the_proposal_beside_the_recorded_config_at_that_rate(db, capsys):
    assert main(["whatif", "--db", db, "--json", "--set", "max_num_seqs=16",
                 "--rate-scale", "3", *SLO]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["columns"] == ["recorded", "predicted", "as-is@3x", "proposed"]
    assert result["baseline"] == "as-is@3x" and result["rate_scale"] == 3
    rows = {r["metric"]: r for r in result["rows"]}
    # three times the arrivals in a third of the time: the same engine queues more
    assert rows["requests"]["values"]["as-is@3x"] == rows["requests"]["values"]["predicted"]
    assert rows["queue_p99_s"]["values"]["as-is@3x"] > rows["queue_p99_s"]["values"][
        "predicted"]
    assert rows["ttft_p99_s"]["ratios"]["proposed"] == pytest.approx(
        rows["ttft_p99_s"]["values"]["proposed"] / rows["ttft_p99_s"]["values"]["as-is@3x"])
    assert "predicted" in rows["ttft_p99_s"]["ratios"]  # the self-check stays at 1x
    assert main(["whatif", "--db", db, "--set", "max_num_seqs=16", "--rate-scale", "3"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert header.split()[-2:] == ["predicted/recorded", "proposed/as-is@3x"]
    assert "rate scale 3: the recorded arrivals at 3x their rate" in out


def test_a_sweep_gives_goodput_against_rate_and_each_configs_capacity(db, tmp_path, capsys):
    png = tmp_path / "capacity.png"
    assert main(["whatif", "--db", db, "--json", "--compare", "few:max_num_seqs=1",
                 "--rate-sweep", "4,1,8", "--plot", str(png), *SLO]) == 0
    cap = json.loads(capsys.readouterr().out)["capacity"]
    assert cap["rates"] == [1.0, 4.0, 8.0]
    assert set(cap["configs"]) == {"as-is", "few"}
    for rows in cap["configs"].values():
        offered = [r["offered_rps"] for r in rows]
        assert offered[1] == pytest.approx(4 * offered[0])
        assert offered[2] == pytest.approx(8 * offered[0])
        assert all(r["requests"] == rows[0]["requests"] for r in rows)
    few, as_is = cap["configs"]["few"], cap["configs"]["as-is"]
    # one sequence at a time falls behind first: fewer meet the SLO at the highest rate
    assert few[-1]["met_share_of_offered"] < as_is[-1]["met_share_of_offered"]
    for name, rows in cap["configs"].items():
        capacity = cap["capacity"][name]
        ok = [r["met_share_of_offered"] >= cap["met_share_for_capacity"] for r in rows]
        expected = None
        for r, good in zip(rows, ok, strict=True):
            if not good:
                break
            expected = r["rate_scale"]
        assert capacity == expected, (name, rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["whatif", "--db", db, "--set", "max_num_seqs=1", "--rate-sweep", "1,2",
                 *SLO]) == 0
    out = capsys.readouterr().out
    assert "capacity: every config at each rate scale" in out
    assert "\nas-is: capacity " in out and "\nproposed: capacity " in out
    assert "offered_rps" in out and "met_share_of_offered" in out


@pytest.mark.parametrize(("args", "needle"), [
    (["--rate-scale", "0"], "--rate-scale=0.0 must be a number in (0, 100]"),
    (["--rate-scale", "1e9"], "--rate-scale=1000000000.0 must be"),
    (["--rate-sweep", "1,x"], "--rate-sweep '1,x' must be comma-separated numbers"),
    (["--rate-sweep", "1,1"], "names a rate scale twice"),
    (["--rate-sweep", ",".join(str(i + 1) for i in range(MAX_SWEEP_RATES + 1))],
     f"1 to {MAX_SWEEP_RATES} rate scales"),
    (["--rate-sweep", "2,-1"], "--rate-sweep[1]=-1.0 must be"),
])
def test_bad_rates_are_exit_2_naming_the_flag(db, capsys, args, needle):
    assert main(["whatif", "--db", db, "--set", "max_num_seqs=4", *args]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(("body", "param"), [
    ({"rate_scale": "2"}, "rate_scale"), ({"rate_scale": float("nan")}, "rate_scale"),
    ({"rate_scale": True}, "rate_scale"), ({"rate_sweep": 2}, "rate_sweep"),
    ({"rate_sweep": [1, 0]}, "rate_sweep"), ({"rate_sweep": []}, "rate_sweep"),
])
def test_bad_rates_in_a_request_are_400_naming_the_field(body, param):
    with pytest.raises(APIError) as err:
        parse_rates(body)
    assert err.value.status == 400 and err.value.param == param


def test_good_rates_in_a_request():
    assert parse_rates({"rate_scale": 2, "rate_sweep": [3, 1.5]}) == {
        "rate_scale": 2.0, "rate_sweep": (1.5, 3.0)}
    assert parse_rates({}) == {}
    assert START > 0


def test_one_replica_behind_the_router_is_the_single_replay(db):
    """The fleet replay's lockstep loop, on one replica, gives what the single replay
    gives: the same requests ending the same way at the same times."""
    from control.whatif.calibrate import calibrate
    from control.whatif.configs import base_config, recorded_config
    from control.whatif.fleet_replay import replay_fleet
    from control.whatif.replay import replay

    window = read_trace_window(db)
    model = calibrate(window.samples)
    config, _ = recorded_config(window, base_config(window, None)[0])
    one = replay(window, config, model)
    fleet = replay_fleet(window, config, model, replicas=1)
    assert [(r.request_id, r.outcome) for r in fleet.records] == [
        (r.request_id, r.outcome) for r in one.records]
    assert [r.ttft_s for r in fleet.records] == pytest.approx([r.ttft_s for r in one.records])
    assert fleet.steps == one.steps and fleet.kv_peak_blocks == one.kv_peak_blocks


def test_replicas_share_a_faster_load(db, capsys):
    assert main(["whatif", "--db", db, "--json", "--set", "max_num_seqs=8",
                 "--rate-scale", "8", "--replicas", "4", *SLO]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["columns"] == ["recorded", "predicted", "as-is@8x,4rep", "proposed"]
    assert result["replicas"] == 4
    assert main(["whatif", "--db", db, "--json", "--set", "max_num_seqs=8",
                 "--rate-scale", "8", *SLO]) == 0
    alone = json.loads(capsys.readouterr().out)
    p99 = {r["metric"]: r for r in result["rows"]}["ttft_p99_s"]["values"]["as-is@8x,4rep"]
    p99_alone = {r["metric"]: r for r in alone["rows"]}["ttft_p99_s"]["values"]["as-is@8x"]
    assert p99 < p99_alone / 2  # four replicas carry eight times the rate far better
    rows = {r["metric"]: r for r in result["rows"]}
    assert rows["requests"]["values"]["as-is@8x,4rep"] == rows["requests"]["values"]["recorded"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--replicas", "0"], "--replicas=0 must be a whole number of replicas in 1..64"),
    (["--replicas", "65"], "--replicas=65 must be"),
])
def test_bad_replicas_are_exit_2(db, capsys, args, needle):
    assert main(["whatif", "--db", db, "--set", "max_num_seqs=4", *args]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("value", ["2", 2.5, 0, True, 1000])
def test_bad_replicas_in_a_request_are_400(value):
    with pytest.raises(APIError) as err:
        parse_rates({"replicas": value})
    assert err.value.status == 400 and err.value.param == "replicas"


@pytest.mark.parametrize("replicas", [0, 65])
def test_the_fleet_replay_refuses_a_replica_count_out_of_range(replicas):
    from control.whatif.fleet_replay import MAX_REPLICAS, replay_fleet

    with pytest.raises(ValueError, match=f"must be in 1..{MAX_REPLICAS}"):
        replay_fleet(None, None, None, replicas=replicas)


def test_a_capacity_at_the_highest_rate_swept_is_a_floor():
    """A config that met its SLO at every rate swept may do at higher ones too: "at
    least"; one that stopped lower is read as it is; one that never met it, "under"."""
    rates = [1.0, 2.0, 4.0]
    rows = [{c: None for c in CAPACITY_COLUMNS} | {"rate_scale": r} for r in rates]
    text = "\n".join(capacity_lines({
        "met_share_for_capacity": 0.95, "rates": rates,
        "configs": {"as-is": rows, "few": rows, "lowest": rows, "none": rows},
        "capacity": {"as-is": 4.0, "few": 2.0, "lowest": 1.0, "none": None}}))
    assert "\nas-is: capacity at least 4x the recorded rate\n" in text
    assert "\nfew: capacity 2x the recorded rate\n" in text
    assert "\nlowest: capacity 1x the recorded rate\n" in text
    assert "\nnone: capacity under 1x (none of the swept rates)\n" in text
