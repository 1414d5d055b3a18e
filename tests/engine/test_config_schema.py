"""The serving config's schema at its edges (engine/config/schema.py): a value just past a
bound is refused with a message naming the field and what it may be, the bound itself is
served, and a lane's own SLO is the one its requests are judged by."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine import LLM
from engine.config import EngineConfig, LaneSLO, LiveConfig, StaticConfig
from engine.config.field_types import check_field_types
from engine.config.patch import apply_patch
from engine.config.schema import FIELD_TYPES, LaneConfig
from engine.config.yaml_loader import load_config_dict


@pytest.mark.parametrize(("data", "message", "served"), [
    # equal watermarks leave no band where a request queues for KV: the first one over is
    # rejected outright
    ({"serving": {"kv_cache_high_watermark": 0.95, "kv_cache_reject_watermark": 0.95}},
     "kv_cache_high_watermark=0.95 must be in (0, kv_cache_reject_watermark=0.95)",
     {"serving": {"kv_cache_high_watermark": 0.94, "kv_cache_reject_watermark": 0.95}}),
    # 0 would end every stream as idle before its first token
    ({"serving": {"stream_idle_timeout_ms": 0}}, "stream_idle_timeout_ms=0 must be >= 1",
     {"serving": {"stream_idle_timeout_ms": 1}}),
    # a misspelt policy must not run as some other one
    ({"serving": {"step_policy": "godput"}},
     "step_policy='godput' must be one of goodput, fixed",
     {"serving": {"step_policy": "fixed"}}),
    # the lanes replaced, the default long_context lane left behind: every long prompt
    # would be routed to a lane that does not exist
    ({"lanes": {"interactive": {}, "batch": {}}},
     "long_context_lane='long_context' must be one of the lanes (interactive, batch) or null",
     {"lanes": {"interactive": {}, "batch": {}}, "serving": {"long_context_lane": None}}),
], ids=["watermarks-equal", "stream-idle-zero", "step-policy-typo", "long-lane-gone"])
def test_a_value_just_past_a_bound_is_refused_naming_it_and_the_bound_is_served(
        data, message, served):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config_dict(data)
    load_config_dict(served).config.validate()


def test_removing_the_long_context_lane_live_is_refused_and_nothing_changes():
    """The same check on a live change (PATCH /control/config): the lane goes only with
    long_context_lane moved or set to null in the same change."""
    live, static = LiveConfig(), StaticConfig()
    with pytest.raises(ValueError, match=re.escape("long_context_lane='long_context' must be"
                                                   " one of the lanes")):
        apply_patch(live, static, {"lanes": {"long_context": None}})
    assert live.lane_names == ("interactive", "long_context", "batch")
    moved = apply_patch(live, static, {"lanes": {"long_context": None},
                                       "long_context_lane": "batch"})
    assert moved.long_context_lane == "batch"


def test_a_prefill_chunk_as_long_as_the_context_is_served_and_one_token_more_is_not():
    """One chunk per prompt (prefill_chunk_size == max_model_len) is a valid setting: the
    limit is inclusive."""
    static = StaticConfig(max_model_len=4096)
    EngineConfig(static, LiveConfig(prefill_chunk_size=4096)).validate()
    with pytest.raises(ValueError, match=re.escape("prefill_chunk_size=4097 must be in"
                                                   " 1..max_model_len (4096)")):
        EngineConfig(static, LiveConfig(prefill_chunk_size=4097)).validate()


def test_a_lane_with_its_own_slo_is_judged_by_it_and_one_without_by_the_default():
    """`lane_slo` is what admission, step sizing and the replica's queue_slo_share read: a
    lane's own targets must win over default_slo, which only fills in for lanes that set
    none."""
    live = load_config_dict({
        "lanes": {"chat": {"slo": {"ttft_s": 2, "tpot_s": 0.2}}, "bulk": {}},
        "serving": {"default_lane": "chat", "long_context_lane": None,
                    "default_slo": {"ttft_s": 60}},
    }).config.live
    assert live.lane_slo(live.lane("chat")) == LaneSLO(ttft_s=2, tpot_s=0.2)
    assert live.lane_slo(live.lane("bulk")) == LaneSLO(ttft_s=60)
    # the built-in lanes: interactive carries its own, batch has none and no default
    defaults = LiveConfig()
    assert defaults.lane_slo(defaults.lane("interactive")) == LaneSLO(ttft_s=5.0, tpot_s=0.5)
    assert not defaults.lane_slo(defaults.lane("batch")).is_set


@pytest.mark.parametrize(("override", "message"), [
    ({"max_num_seqs": "64"}, "max_num_seqs='64' must be of type int"),
    ({"max_num_seqs": 2.5}, "max_num_seqs=2.5 must be of type int"),
    ({"prefill_chunk_size": True}, "prefill_chunk_size=True must be an integer"),
    ({"kv_cache_high_watermark": "0.9"}, "kv_cache_high_watermark='0.9' must be of type float"),
])
def test_settings_given_in_code_are_typed_as_the_yamls_before_a_model_loads(override,
                                                                            message):
    """LLM(max_num_seqs="64") met a TypeError inside the range checks, and 2.5 or True
    passed them (bool is an int to Python): the keyword arguments now get the YAML's type
    checks, before the model is looked for ('nowhere' would be the next error)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        LLM("nowhere", **override)


def test_a_numpy_integer_from_code_is_a_whole_number():
    check_field_types({"max_num_seqs": np.int64(8), "kv_cache_high_watermark": np.float32(0.5),
                       "max_model_len": 512}, "", FIELD_TYPES)
    EngineConfig(StaticConfig(max_model_len=np.int64(512)),
                 LiveConfig(max_num_seqs=np.int32(8), prefill_chunk_size=np.int64(512))).validate()


@pytest.mark.parametrize(("build", "message"), [
    # a str compared with an int raised TypeError inside the range check
    (lambda: EngineConfig(live=LiveConfig(max_num_seqs="64")), "max_num_seqs='64' must be"
     " of type int"),
    # a float or a bool passed the range checks and ran
    (lambda: EngineConfig(live=LiveConfig(max_num_seqs=2.5)), "max_num_seqs=2.5 must be"
     " of type int"),
    (lambda: EngineConfig(StaticConfig(enable_prefix_caching="no")),
     "enable_prefix_caching='no' must be of type bool"),
    (lambda: EngineConfig(StaticConfig(num_kv_blocks=True)), "num_kv_blocks=True must be an"
     " integer"),
    (lambda: EngineConfig(live=LiveConfig(lanes=(LaneConfig("a", max_running=1.5),),
                                          default_lane="a", long_context_lane=None)),
     "lanes.a.max_running=1.5 must be of type int"),
])
def test_a_config_built_in_code_is_typed_as_its_yaml_would_be(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build().validate()
