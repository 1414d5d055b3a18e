"""Live config changes: versioned, validated, applied from the very next step."""

from __future__ import annotations

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt

from engine.config import LaneConfig
from engine.request import SamplingParams

TWO_LANES = (LaneConfig("interactive"), LaneConfig("batch", preempt_first=True))
LONG = SamplingParams(max_tokens=30, ignore_eos=True)


def _busy_driver(**changes) -> Driver:
    engine, _ = make_engine(live_config(TWO_LANES, **changes))
    d = Driver(engine)
    for i in range(6):
        d.add(f"r{i}", prompt(i, 40), LONG)
    return d


def test_update_applies_at_the_next_step_with_a_new_version():
    d = _busy_driver(max_num_seqs=8, max_num_batched_tokens=256)
    first = d.step()
    assert first.record.config_version == 1
    assert first.record.num_prefill_seqs == 6
    installed = d.update_config(d.engine.live_config.replace(max_num_seqs=2,
                                                             max_num_batched_tokens=32))
    assert installed.version == 2 and d.engine.live_config is installed
    nxt = d.step()
    assert nxt.record.config_version == 2
    assert nxt.record.token_budget == 32
    assert nxt.record.num_decode_seqs == 2  # six running, two allowed per step now
    d.run()  # the others still finish


def test_invalid_update_names_the_field_and_keeps_the_old_config():
    d = _busy_driver(max_num_seqs=8, max_num_batched_tokens=256)
    d.step()
    before = d.engine.live_config
    bad_changes = [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"kv_cache_high_watermark": 0.97, "kv_cache_reject_watermark": 0.95},
         "kv_cache_high_watermark"),
        ({"schedule_policy": "fastest"}, "schedule_policy"),
        ({"default_lane": "missing"}, "default_lane"),
        ({"lanes": (LaneConfig("interactive", weight=0), LaneConfig("batch"))},
         "lanes.interactive.weight"),
    ]
    for changes, field in bad_changes:
        with pytest.raises(ValueError, match=field):
            d.update_config(before.replace(**changes))
        assert d.engine.live_config is before
    out = d.step()
    assert out.record.config_version == before.version
    assert out.record.token_budget == 256
    d.run()


def test_removing_a_lane_with_requests_needs_a_target():
    engine, _ = make_engine(live_config(TWO_LANES, max_num_seqs=2))
    d = Driver(engine)
    d.add("b-run", prompt(1, 20), LONG, lane="batch")
    d.step()  # b-run is running in the batch lane
    for i in range(3):
        d.add(f"b{i}", prompt(10 + i, 20), LONG, lane="batch")
    only_interactive = d.engine.live_config.replace(lanes=(LaneConfig("interactive"),))
    with pytest.raises(ValueError, match="'batch'"):
        d.update_config(only_interactive)
    assert d.engine.live_config.lane_names == ("interactive", "batch")
    with pytest.raises(ValueError, match="lane_moves"):
        d.update_config(only_interactive, lane_moves={"batch": "nowhere"})

    d.update_config(only_interactive, lane_moves={"batch": "interactive"})
    assert {d.engine.get_request(r).lane for r in ("b-run", "b0", "b1", "b2")} == {
        "interactive"}
    d.run()
    records = d.finished_records()
    assert all(records[r].lane == "interactive" and records[r].finish_reason == "length"
               for r in ("b-run", "b0", "b1", "b2"))
    assert all("batch" not in rec.waiting_by_lane for rec in d.records()[1:])


def test_a_cancelled_request_does_not_hold_its_lane():
    engine, _ = make_engine(live_config(TWO_LANES))
    d = Driver(engine)
    d.add("b", prompt(1, 20), lane="batch")
    assert d.abort("b")
    d.update_config(d.engine.live_config.replace(lanes=(LaneConfig("interactive"),)))
    d.run()


def test_policy_and_batching_swaps_mid_run_keep_every_request():
    d = _busy_driver(max_num_seqs=3, max_num_batched_tokens=64, prefill_chunk_size=16)
    swaps = [
        {"schedule_policy": "mixed"},
        {"batching": "static"},
        {"lanes": (LaneConfig("interactive", policy="priority", tenant_fair_share=True),
                   LaneConfig("batch", max_running=1))},
        {"batching": "continuous", "chunked_prefill": False, "prefill_chunk_size": 8,
         "max_num_batched_tokens": 2048},
    ]
    for changes in swaps:
        d.step()
        d.step()
        d.update_config(d.engine.live_config.replace(**changes))
    d.run()
    assert {r.config_version for r in d.records()} == {1, 2, 3, 4, 5}
    assert all(log.finish_reason == "length" for log in d.logs.values())


@pytest.mark.parametrize("policy", ["decode_first", "mixed"])
def test_lowering_max_num_seqs_under_load_lets_every_running_request_advance(policy):
    """Six decoding, the limit cut to two: the six take turns (each advances within three
    steps) instead of the newest four stalling until the first two finish."""
    d = _busy_driver(max_num_seqs=8, max_num_batched_tokens=256, schedule_policy=policy)
    d.step()  # all six prefilled
    d.update_config(d.engine.live_config.replace(max_num_seqs=2))
    served: list[set[str]] = []
    for _ in range(6):
        out = d.step()
        assert out.record.num_decode_seqs == 2
        served.append({rid for rid, kind, _ in out.record.scheduled if kind == "decode"})
    assert set().union(*served[:3]) == {f"r{i}" for i in range(6)}
    assert set().union(*served[3:]) == {f"r{i}" for i in range(6)}
    d.run()  # and all finish
