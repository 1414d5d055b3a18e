"""Live config changes as data: merge patches, validation, diffs."""

from __future__ import annotations

import pytest

from engine.config import LaneSLO, LiveConfig, StaticConfig
from engine.config.patch import apply_diff, apply_patch, diff, live_from_dict, live_to_dict, merge

STATIC = StaticConfig(num_kv_blocks=512, max_model_len=4096)
LIVE = LiveConfig(prefill_chunk_size=512)


def test_merge_follows_rfc_7396():
    assert merge({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}, "f": 5}) == {
        "a": 1, "b": {"d": 3, "e": 4}, "f": 5}
    assert merge({"a": {"b": 1}}, {"a": [1, 2]}) == {"a": [1, 2]}


def test_round_trip_and_diff():
    assert live_from_dict(live_to_dict(LIVE)) == LIVE.replace(version=0)
    new = apply_patch(LIVE, STATIC, {"max_active_sequences": 64, "lanes": {
        "batch": {"batching": "static"}, "bulk": {"weight": 0.5}, "long_context": None},
        "long_context_lane": None, "tenant_lanes": {"acme": "bulk"}})
    assert new.max_num_seqs == 64 and new.long_context_lane is None
    assert new.lane_names == ("interactive", "batch", "bulk")
    assert new.lane("batch").batching == "static"
    assert dict(new.tenant_lanes) == {"acme": "bulk"}
    changes = diff(LIVE, new)
    assert changes["max_num_seqs"] == [128, 64]
    assert changes["lanes.batch.batching"] == [None, "static"]
    assert changes["lanes.long_context"][1] is None and changes["lanes.bulk"][0] is None
    assert changes["tenant_lanes.acme"] == [None, "bulk"]
    assert diff(new, new) == {}


@pytest.mark.parametrize("patch, field", [
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_seqs": 1024}, "max_num_seqs"),  # more than the KV pool has blocks
    ({"prefill_chunk_size": 8192}, "prefill_chunk_size"),  # over max_model_len
    ({"kv_cache_high_watermark": 0.97}, "kv_cache_high_watermark"),  # above reject
    ({"max_num_batched_tokens": "lots"}, "max_num_batched_tokens"),
    ({"lanes": {"batch": {"weight": 0}}}, "lanes.batch.weight"),
    ({"lanes": {"batch": {"colour": "red"}}}, "colour"),
    ({"num_kv_blocks": 1024}, "num_kv_blocks"),  # static: needs a restart
    ({"max_num_seqs": None}, "max_num_seqs"),
    ({"default_lane": "nope"}, "default_lane"),
    ({"tenant_lanes": {"acme": "nope"}}, "tenant_lanes.acme"),
    ({"lanes": {"interactive": None, "long_context": None, "batch": None}}, "lanes"),
    ({"surprise": 1}, "surprise"),
    ({"version": 5}, "version"),  # assigned by the engine, not a setting: refused, not ignored
])
def test_an_invalid_change_names_its_field(patch, field):
    with pytest.raises(ValueError, match=field.split(".")[-1]):
        apply_patch(LIVE, STATIC, patch)


def test_the_original_snapshot_is_never_modified():
    before = live_to_dict(LIVE)
    apply_patch(LIVE, STATIC, {"lanes": {"batch": {"weight": 9}}})
    with pytest.raises(ValueError):
        apply_patch(LIVE, STATIC, {"lanes": {"batch": {"weight": -9}}})
    assert live_to_dict(LIVE) == before


def test_a_recorded_diff_replayed_gives_the_config_it_was_taken_from():
    """apply_diff (the what-if rebuilding the config in force from the trace's changes)
    inverts diff: fields, a lane's nested SLO, a lane and a tenant mapping added and
    removed (a tenant's name may hold dots)."""
    before = LiveConfig(tenant_lanes={"acme.corp": "batch", "old": "batch"})
    after = apply_patch(before, StaticConfig(), {
        "step_policy": "fixed", "slo_unreachable": "serve", "long_context_lane": None,
        "default_slo": {"ttft_s": 9.0},
        "lanes": {"interactive": {"slo": {"ttft_s": 2.0}, "max_running": 5},
                  "bulk": {"weight": 0.5}, "batch": {"preempt_first": False}},
        "tenant_lanes": {"acme.corp": "bulk", "old": None, "new.co": "interactive"}})
    changes = diff(before, after)
    assert {"tenant_lanes.acme.corp", "lanes.bulk", "long_context_lane"} <= set(changes)
    assert apply_diff(before, changes) == after
    assert apply_diff(after, diff(after, before)) == before


def test_a_patch_of_one_default_slo_target_keeps_the_other():
    """{"default_slo": {"ttft_s": 9}} merges into the SLO in force: its tpot_s stays (the
    snapshot as data holds the SLO as a mapping, which GET /control/config also serves)."""
    live = LiveConfig(default_slo=LaneSLO(ttft_s=1.0, tpot_s=0.1))
    new = apply_patch(live, STATIC, {"default_slo": {"ttft_s": 9.0}})
    assert new.default_slo == LaneSLO(ttft_s=9.0, tpot_s=0.1)
    assert live_to_dict(live)["default_slo"] == {"ttft_s": 1.0, "tpot_s": 0.1}
    assert diff(live, new) == {"default_slo.ttft_s": [1.0, 9.0]}
