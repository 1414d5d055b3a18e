"""Preempt to start (issue 17, item 10): a request of a `preempt_to_start` lane that the KV
keeps from starting preempts running requests of `preempt_first` lanes, configurable per
lane and live; batch work still completes, and nothing is preempted back and forth."""

from __future__ import annotations

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt

from engine.config import LaneConfig, LiveConfig, StaticConfig
from engine.config.patch import apply_patch
from engine.config.yaml_loader import load_config_dict
from engine.request import SamplingParams

BATCH = SamplingParams(max_tokens=60, ignore_eos=True)
CHAT = SamplingParams(max_tokens=8, ignore_eos=True)


def _lanes(preempt_to_start: bool) -> tuple[LaneConfig, ...]:
    return (LaneConfig("interactive", weight=4.0, policy="priority",
                       preempt_to_start=preempt_to_start),
            LaneConfig("batch", weight=1.0, preempt_first=True))


def _flooded(preempt_to_start: bool, reject_watermark: float = 1.0) -> Driver:
    """64 blocks of 16; eight batch requests growing to 8 blocks each hold the KV above
    the high watermark (0.88) when the interactive request arrives (admission refuses
    nothing for the KV unless `reject_watermark` is below 1)."""
    live = live_config(_lanes(preempt_to_start), max_num_seqs=16,
                       kv_cache_reject_watermark=reject_watermark)
    engine, _ = make_engine(live, num_kv_blocks=64)
    d = Driver(engine)
    for i in range(8):
        d.add(f"b{i}", prompt(i, 64), BATCH, lane="batch")
    while engine.block_manager.usage <= live.kv_cache_high_watermark:
        d.step()
    return d


def _first_token_step(d: Driver, request_id: str) -> int:
    return next(rec.step_id for rec in d.records() for rid, kind, n in rec.scheduled
                if rid == request_id and kind != "decode" and n > 0) + 1


def _preempted(d: Driver) -> list[str]:
    return [rid for rec in d.records() for rid in rec.decisions.preempted]


@pytest.mark.parametrize("on", [True, False])
def test_an_interactive_request_starts_under_a_batch_flood_only_when_allowed(on):
    d = _flooded(on)
    arrived_after = d.records()[-1].step_id
    preempted_before = len(_preempted(d))
    d.add("chat", prompt(100, 32), CHAT, lane="interactive")
    d.run()  # every batch request completes with its full, undisturbed output
    waited = _first_token_step(d, "chat") - arrived_after
    ended = d.finished_records()
    assert all(ended[f"b{i}"].finish_reason == "length" for i in range(8))
    assert ended["chat"].finish_reason == "length" and ended["chat"].num_preemptions == 0
    if on:
        assert waited <= 2, waited
        victims = _preempted(d)[preempted_before:]
        assert victims and all(v.startswith("b") for v in victims)
    else:
        assert waited >= 10, waited  # until enough batch work finished


def test_no_victims_when_they_would_not_free_enough():
    # Only one small batch request runs beside a large interactive one: preempting it
    # cannot make room for the next interactive prompt, so nothing is preempted.
    live = live_config(_lanes(True), max_num_seqs=8)
    engine, _ = make_engine(live, num_kv_blocks=16)
    d = Driver(engine)
    d.add("big", prompt(1, 200), SamplingParams(max_tokens=20, ignore_eos=True))
    d.add("b0", prompt(2, 8), SamplingParams(max_tokens=20, ignore_eos=True), lane="batch")
    d.step()
    d.step()
    d.add("chat", prompt(3, 100), CHAT)
    d.run()
    assert "b0" not in _preempted(d)
    assert d.finished_records()["b0"].num_preemptions == 0


def test_admission_does_not_count_what_preempt_first_lanes_hold_against_such_a_lane():
    # The flood holds every block: above the 0.95 reject watermark.
    d = _flooded(True, reject_watermark=0.95)
    assert d.engine.block_manager.usage > 0.95
    assert d.add("chat", prompt(100, 32), CHAT, lane="interactive").accepted
    d.update_config(d.engine.live_config.replace(lanes=_lanes(False)))
    refused = d.add("chat2", prompt(101, 32), CHAT, lane="interactive")
    assert (refused.accepted, refused.reason) == (False, "kv_reject_watermark")
    d.run()


def test_the_setting_is_live():
    d = _flooded(False)
    d.add("chat", prompt(100, 32), CHAT, lane="interactive")
    d.step()
    d.step()
    assert not d.steps_of("chat")  # held back by the watermark
    live = d.engine.live_config
    d.update_config(live.replace(lanes=_lanes(True)))
    d.step()
    assert d.steps_of("chat")  # started in the first step under the new config
    d.run()


def test_a_lane_cannot_both_preempt_to_start_and_be_preempted_first():
    with pytest.raises(ValueError, match=r"lanes\.x\.preempt_to_start=True must be false"):
        LaneConfig("x", preempt_first=True, preempt_to_start=True).validate()


def test_yaml_and_the_control_patch_set_it():
    serving = {"long_context_lane": None}
    loaded = load_config_dict({"serving": serving,
                               "lanes": {"interactive": {"preempt_to_start": True},
                                         "batch": {"preempt_first": True}}})
    assert loaded.config.live.lane("interactive").preempt_to_start
    with pytest.raises(ValueError, match="preempt_to_start='yes' must be of type bool"):
        load_config_dict({"serving": serving,
                          "lanes": {"interactive": {"preempt_to_start": "yes"}}})
    static = StaticConfig()
    patched = apply_patch(LiveConfig(), static,
                          {"lanes": {"interactive": {"preempt_to_start": True}}})
    assert patched.lane("interactive").preempt_to_start
    assert not LiveConfig().lane("interactive").preempt_to_start  # off unless set
    with pytest.raises(ValueError, match="preempt_to_start"):
        apply_patch(LiveConfig(), static, {"lanes": {"batch": {"preempt_to_start": True}}})
