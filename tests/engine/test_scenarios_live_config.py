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


def test_a_lane_with_only_running_requests_is_not_removed_without_a_target():
    """Nothing queued in batch, one request running there: that request still needs a
    lane, so the change is refused until one is named; with one, it finishes there."""
    engine, _ = make_engine(live_config(TWO_LANES))
    d = Driver(engine)
    d.add("b-run", prompt(1, 20), LONG, lane="batch")
    d.step()
    assert engine.get_request("b-run").status.name == "RUNNING"
    only_interactive = d.engine.live_config.replace(lanes=(LaneConfig("interactive"),))
    with pytest.raises(ValueError, match="lane 'batch' still has 1 requests"):
        d.update_config(only_interactive)
    assert d.engine.live_config.lane_names == ("interactive", "batch")
    d.update_config(only_interactive, lane_moves={"batch": "interactive"})
    d.run()
    assert d.finished_records()["b-run"].lane == "interactive"


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


@pytest.mark.parametrize("limit", ["max_num_batched_tokens", "max_num_seqs"])
@pytest.mark.parametrize("policy", ["decode_first", "mixed"])
def test_every_running_request_advances_whichever_limit_is_lowered(policy, limit):
    """Sixteen streams decoding, one limit cut from 64 to 8 under load: over 40 steps
    each stream gets 20 tokens and none waits two steps in a row, under either policy
    (not the first eight 40 tokens each and the other eight none)."""
    engine, _ = make_engine(live_config(TWO_LANES, max_num_seqs=64, max_num_batched_tokens=64,
                                        schedule_policy=policy))
    d = Driver(engine)
    names = [f"r{i}" for i in range(16)]
    for i, rid in enumerate(names):
        d.add(rid, prompt(100 + i, 4), SamplingParams(max_tokens=60, ignore_eos=True))
    assert d.step().record.num_prefill_seqs == 16  # all prefilled: sixteen decoding
    d.update_config(d.engine.live_config.replace(**{limit: 8}))
    served = [set(d.step().record.decode_ids) for _ in range(40)]
    assert all(len(step) == 8 for step in served)
    assert {rid: sum(rid in step for step in served) for rid in names} == dict.fromkeys(
        names, 20)
    assert all(a | b == set(names) for a, b in zip(served[:-1], served[1:], strict=True))
    d.run()  # and all finish, with the tokens of an undisturbed run


@pytest.mark.parametrize("policy", ["decode_first", "mixed"])
def test_prompts_part_way_take_turns_when_the_token_budget_is_cut(policy):
    """Ten prompts part-way through prefill, the budget cut to one chunk a step: the
    chunk goes round the ten in turn (two each in 20 steps), not to the same few."""
    engine, _ = make_engine(live_config(TWO_LANES, max_num_seqs=16, max_num_batched_tokens=320,
                                        prefill_chunk_size=32, schedule_policy=policy))
    d = Driver(engine)
    names = [f"p{i}" for i in range(10)]
    for i, rid in enumerate(names):
        d.add(rid, prompt(200 + i, 400), SamplingParams(max_tokens=4, ignore_eos=True))
    assert d.step().record.num_prefill_seqs == 10  # a first chunk each
    d.update_config(d.engine.live_config.replace(max_num_batched_tokens=8))
    served = [d.step().record.prefill_chunks for _ in range(20)]
    assert all(len(chunks) == 1 and chunks[0][1] == 8 for chunks in served)
    counts = {rid: sum(chunks[0][0] == rid for chunks in served) for rid in names}
    assert counts == dict.fromkeys(names, 2)
    d.run()


@pytest.mark.parametrize("policy", ["decode_first", "mixed"])
def test_a_prompt_part_way_does_not_stall_streams_when_the_budget_is_cut(policy):
    """Fifteen streams decoding and one long prompt part-way, the budget cut from 128 to 8:
    every stream still gets a token at least every other step. mixed also moves the prompt
    on; decode_first serves every decode first, so the prompt waits for spare budget."""
    engine, _ = make_engine(live_config(TWO_LANES, max_num_seqs=64, max_num_batched_tokens=128,
                                        prefill_chunk_size=32, schedule_policy=policy))
    d = Driver(engine)
    streams = [f"r{i}" for i in range(15)]
    for i, rid in enumerate(streams):
        d.add(rid, prompt(300 + i, 4), SamplingParams(max_tokens=60, ignore_eos=True))
    d.add("long", prompt(400, 600), SamplingParams(max_tokens=4, ignore_eos=True))
    assert d.step().record.num_prefill_seqs == 16
    d.update_config(d.engine.live_config.replace(max_num_batched_tokens=8))
    records = [d.step().record for _ in range(40)]
    decoded = [set(rec.decode_ids) for rec in records]
    assert all(a | b == set(streams) for a, b in zip(decoded[:-1], decoded[1:], strict=True))
    prompt_tokens = sum(n for rec in records for rid, n in rec.prefill_chunks if rid == "long")
    assert prompt_tokens == (20 if policy == "mixed" else 0)
    d.run()
