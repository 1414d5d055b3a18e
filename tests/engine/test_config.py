"""Config loading and validation: what an operator writes, and what they are told."""

from __future__ import annotations

import re

import pytest

from engine.config import EngineConfig, LaneConfig, LiveConfig, StaticConfig
from engine.config.yaml_loader import check_profiles, load_config_dict, load_config_file

# The seed's starting point, exactly as DESIGN.md shows it.
DESIGN_SERVING = """\
serving:
  max_active_sequences: 128
  max_waiting_requests: 512
  max_batched_tokens: 8192
  max_model_len: 32768
  prefill_chunk_size: 2048
  queue_timeout_ms: 30000
  stream_idle_timeout_ms: 10000
  kv_cache_high_watermark: 0.88
  kv_cache_reject_watermark: 0.95
"""


def test_design_serving_block_loads_as_written(tmp_path):
    path = tmp_path / "serving.yaml"
    path.write_text(DESIGN_SERVING)
    config = load_config_file(path).config
    live, static = config.live, config.static
    assert live.max_num_seqs == 128
    assert live.max_waiting_requests == 512
    assert live.max_num_batched_tokens == 8192
    assert static.max_model_len == 32768
    assert live.prefill_chunk_size == 2048
    assert live.queue_timeout_ms == 30000
    assert live.stream_idle_timeout_ms == 10000
    assert (live.kv_cache_high_watermark, live.kv_cache_reject_watermark) == (0.88, 0.95)


def test_an_empty_file_or_an_empty_serving_block_loads_the_defaults(tmp_path):
    """An empty YAML file (or `serving:` with nothing under it) is every default, not a
    start that fails on 'config must be a mapping'."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set yet\n")
    assert load_config_file(empty).config == EngineConfig(StaticConfig(), LiveConfig())
    bare = tmp_path / "bare.yaml"
    bare.write_text("serving:\nprofiles:\n  degrade: {max_active_sequences: 32}\n")
    loaded = load_config_file(bare)
    assert loaded.config.live == LiveConfig() and loaded.profiles == {"degrade": {
        "max_num_seqs": 32}}


def test_our_key_names_load_too():
    config = load_config_dict({"serving": {"max_num_seqs": 7, "max_num_batched_tokens": 4096,
                                           "schedule_policy": "mixed"}}).config
    assert (config.live.max_num_seqs, config.live.max_num_batched_tokens) == (7, 4096)
    assert config.live.schedule_policy == "mixed"


def test_lanes_and_profiles_parse():
    loaded = load_config_dict({
        "serving": {"max_active_sequences": 64, "long_context_lane": None},
        "lanes": {
            "interactive": {"weight": 4, "policy": "priority", "max_running": 32},
            "batch": {"weight": 1, "preempt_first": True, "batching": "static",
                      "tenant_fair_share": True, "queue_timeout_ms": 600000},
        },
        "profiles": {"degrade": {"max_active_sequences": 16, "max_batched_tokens": 2048}},
    })
    live = loaded.config.live
    assert live.lane_names == ("interactive", "batch")
    interactive, batch = live.lanes
    assert (interactive.weight, interactive.policy, interactive.max_running) == (4, "priority", 32)
    assert batch.preempt_first and batch.tenant_fair_share and batch.batching == "static"
    assert live.lane_batching(batch) == "static" and live.lane_batching(interactive) == (
        "continuous")
    assert loaded.profiles == {"degrade": {"max_num_seqs": 16, "max_num_batched_tokens": 2048}}


def test_lanes_as_a_list():
    live = load_config_dict({"lanes": [{"name": "interactive", "weight": 2},
                                       {"name": "long_context"}]}).config.live
    assert live.lane_names == ("interactive", "long_context")
    with pytest.raises(ValueError, match="unique lane names"):
        load_config_dict({"lanes": [{"name": "interactive"}, {"name": "interactive"}]})


@pytest.mark.parametrize(("data", "names"), [
    ({"serving": {"max_active_sequence": 8}}, ["max_active_sequence", "serving", "allowed"]),
    ({"servin": {}}, ["servin", "allowed"]),
    ({"lanes": {"interactive": {"wieght": 2}}}, ["wieght", "lanes.interactive"]),
    ({"profiles": {"degrade": {"block_size": 8}}}, ["block_size", "profiles.degrade"]),
    ({"serving": {"version": 3}}, ["version", "serving"]),  # the engine's to assign
])
def test_unknown_keys_are_errors_that_list_the_allowed_keys(data, names):
    with pytest.raises(ValueError) as exc:
        load_config_dict(data)
    for name in names:
        assert name in str(exc.value)


@pytest.mark.parametrize(("data", "hint"), [
    ({"max_num_seqs": 8}, "(did you mean serving.max_num_seqs?)"),  # a serving setting on top
    ({"servin": {}}, "(did you mean serving?)"),
    ({"serving": {"max_num_seqz": 8}}, "(did you mean max_num_seqs?)"),
    ({"lanes": {"batch": {"wieght": 2}}}, "(did you mean weight?)"),
    ({"serving": {"max_num_seqz": 8, "prefill_chunk_sise": 4}},
     "(did you mean max_num_seqs for max_num_seqz, prefill_chunk_size for prefill_chunk_sise?)"),
])
def test_an_unknown_key_close_to_a_known_one_names_it(data, hint):
    with pytest.raises(ValueError, match=re.escape(hint)):
        load_config_dict(data)


@pytest.mark.parametrize("key", ["batch_size", "max_tokens", "chunk_size", "timeout"])
def test_a_key_only_loosely_like_a_known_one_gets_no_hint(key):
    """No 'did you mean' for a key that only shares some letters with a known one: vLLM's
    `batch_size` is not our `block_size` (a hint to change the KV layout), nor is
    `max_tokens` max_batched_tokens."""
    with pytest.raises(ValueError) as exc:
        load_config_dict({"serving": {key: 8}})
    assert "did you mean" not in str(exc.value)


def test_an_slo_block_names_the_close_key_too():
    with pytest.raises(ValueError, match=re.escape("(did you mean ttft_s?)")):
        load_config_dict({"lanes": {"batch": {"slo": {"ttft": 2}}}})


def test_no_hint_when_nothing_is_close():
    with pytest.raises(ValueError) as exc:
        load_config_dict({"serving": {"colour": "blue"}})
    assert "did you mean" not in str(exc.value)


@pytest.mark.parametrize(("serving", "field", "allowed"), [
    ({"max_active_sequences": 0}, "max_num_seqs", "1..8192"),
    ({"max_active_sequences": 9000}, "max_num_seqs", "1..8192"),
    ({"max_batched_tokens": 0}, "max_num_batched_tokens", ">= 1"),
    ({"prefill_chunk_size": 0}, "prefill_chunk_size", ">= 1"),
    ({"block_size": 12}, "block_size", "8, 16, 32, 64, 128"),
    ({"num_kv_blocks": 0}, "num_kv_blocks", ">= 1"),
    ({"queue_timeout_ms": 0}, "queue_timeout_ms", ">= 1"),
    ({"max_waiting_requests": -1}, "max_waiting_requests", ">= 1"),
    ({"max_waiting_requests": 0}, "max_waiting_requests", ">= 1"),
    ({"kv_cache_high_watermark": 0.96}, "kv_cache_high_watermark", "kv_cache_reject_watermark"),
    ({"kv_cache_high_watermark": 0.0}, "kv_cache_high_watermark", "(0,"),
    ({"kv_cache_reject_watermark": 1.5}, "kv_cache_high_watermark", "<= 1"),
    ({"schedule_policy": "fastest"}, "schedule_policy", "decode_first, mixed"),
    ({"batching": "dynamic"}, "batching", "continuous, static"),
])
def test_bad_values_name_the_field_and_the_allowed_range(serving, field, allowed):
    with pytest.raises(ValueError) as exc:
        load_config_dict({"serving": serving})
    assert field in str(exc.value) and allowed in str(exc.value)


@pytest.mark.parametrize(("serving", "field"), [
    ({"max_active_sequences": "lots"}, "serving.max_num_seqs"),
    ({"max_active_sequences": True}, "serving.max_num_seqs"),
    ({"max_active_sequences": 1.5}, "serving.max_num_seqs"),
    ({"kv_cache_high_watermark": "high"}, "serving.kv_cache_high_watermark"),
    ({"chunked_prefill": "no"}, "serving.chunked_prefill"),
    ({"max_active_sequences": None}, "max_num_seqs"),
    ({"kv_cache_reject_watermark": None}, "kv_cache_reject_watermark"),
])
def test_bad_types_name_the_field(serving, field):
    with pytest.raises(ValueError, match=field):
        load_config_dict({"serving": serving})


@pytest.mark.parametrize(("data", "field"), [
    ({"serving": {"kv_cache_reject_watermark": True}}, "serving.kv_cache_reject_watermark"),
    ({"serving": {"kv_cache_high_watermark": False}}, "serving.kv_cache_high_watermark"),
    ({"lanes": {"batch": {"weight": True}}}, "lanes.batch.weight"),
    ({"profiles": {"p": {"kv_cache_high_watermark": True}}}, "profiles.p.kv_cache_high_watermark"),
])
def test_a_boolean_is_not_a_number_for_a_fraction_or_a_weight(data, field):
    """`weight: true` or `kv_cache_reject_watermark: true` (a flag written where a number
    goes) is refused, not loaded as 1.0 (a watermark of 1 rejects nothing)."""
    with pytest.raises(ValueError, match=re.escape(f"{field}=") + ".*must be of type float"):
        load_config_dict(data)


@pytest.mark.parametrize(("lane", "field"), [
    ({"weight": 0}, "lanes.x.weight"),
    ({"weight": float("inf")}, "lanes.x.weight"),
    ({"weight": 1.5e6}, "lanes.x.weight"),
    ({"weight": float("nan")}, "lanes.x.weight"),
    ({"weight": "heavy"}, "lanes.x.weight"),
    ({"policy": "lifo"}, "lanes.x.policy"),
    ({"max_running": 0}, "lanes.x.max_running"),
    ({"batching": "sometimes"}, "lanes.x.batching"),
])
def test_bad_lane_settings_name_the_lane_and_field(lane, field):
    with pytest.raises(ValueError, match=field):
        load_config_dict({"lanes": {"x": lane}, "serving": {}})


def _lanes(names) -> dict:
    return {"lanes": {name: {} for name in names},
            "serving": {"default_lane": names[0], "long_context_lane": None}}


@pytest.mark.parametrize(("data", "message"), [
    (_lanes(["x" * 129]), "must be a name of 1-128 letters"),
    (_lanes([f"l{i}" for i in range(65)]), "lanes=65 must be 1-64 lanes"),
    ({"serving": {"tenant_lanes": {"a\nb": "batch"}}}, "tenant names of 1-128 printable"),
    ({"serving": {"tenant_lanes": {"t" * 129: "batch"}}}, "tenant names of 1-128 printable"),
    ({"serving": {"tenant_lanes": {f"t{i}": "batch" for i in range(4097)}}},
     "tenant_lanes=4097 must be at most 4096 tenants"),
], ids=["long-lane", "65-lanes", "tenant-newline", "long-tenant", "4097-tenants"])
def test_lane_and_tenant_names_and_counts_are_bounded(data, message):
    """As a request may name them (X-Lane, X-Tenant: 128 printable characters); a lane is
    scanned every step and labels metrics, so there are at most 64."""
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config_dict(data)
    names = ["y" * 128] + [f"l{i}" for i in range(63)]
    assert len(load_config_dict(_lanes(names)).config.live.lanes) == 64


def test_lane_routing_must_name_existing_lanes():
    with pytest.raises(ValueError, match="default_lane"):
        load_config_dict({"lanes": {"batch": {}}})  # default lane 'interactive' is gone
    config = load_config_dict({"lanes": {"batch": {}},
                               "serving": {"default_lane": "batch",
                                           "long_context_lane": None}}).config
    assert config.live.default_lane == "batch"


def test_a_profile_with_a_bad_value_is_refused_at_load():
    with pytest.raises(ValueError, match="max_num_seqs"):
        load_config_dict({"profiles": {"degrade": {"max_active_sequences": 0}}})


@pytest.mark.parametrize(("serving", "message"), [
    ({"prefill_chunk_size": 40000}, "prefill_chunk_size=40000 must be in 1..max_model_len"
                                    " (32768)"),
    ({"max_active_sequences": 8192, "num_kv_blocks": 100},
     "max_num_seqs=8192 must be <= num_kv_blocks (100)"),
    ({"chunked_prefill": False, "max_batched_tokens": 8192},
     "max_num_batched_tokens=8192 must be >= max_model_len (32768) when chunked_prefill is"
     " off"),
])
def test_checks_against_the_static_config_wait_for_it(serving, message):
    """The model fits max_model_len and the KV pool (engine/llm.py), so loading the YAML
    leaves these to the fitted config; against a given one they are refused."""
    config = load_config_dict({"serving": serving}).config
    with pytest.raises(ValueError, match=re.escape(message)):
        config.validate()


def test_messages_say_which_static_values_the_model_chose():
    live = LiveConfig(chunked_prefill=False, max_num_batched_tokens=512)
    with pytest.raises(ValueError, match=re.escape("max_model_len (8192, fitted to the"
                                                   " model) when chunked_prefill is off")):
        live.validate(StaticConfig(max_model_len=8192), fitted={"max_model_len"})
    with pytest.raises(ValueError, match=re.escape("num_kv_blocks (4, fitted to the model)")):
        LiveConfig(max_num_seqs=8).validate(StaticConfig(num_kv_blocks=4),
                                            fitted={"num_kv_blocks"})
    live.replace(max_num_batched_tokens=8192).validate(StaticConfig(max_model_len=8192))


def test_a_profile_is_checked_against_the_static_config_once_given():
    loaded = load_config_dict({"profiles": {"whole": {"chunked_prefill": False}}})
    assert loaded.profiles == {"whole": {"chunked_prefill": False}}  # 8192 < 32768: later
    small = EngineConfig(StaticConfig(max_model_len=8192), loaded.config.live)
    check_profiles(loaded.profiles, small)
    with pytest.raises(ValueError, match=re.escape(
            "profiles.whole: max_num_batched_tokens=8192 must be >= max_model_len (32768)")):
        check_profiles(loaded.profiles, loaded.config)


def test_a_profile_refused_at_start_says_which_static_value_the_model_chose():
    """A profile that fails against the fitted config names the value as the model's
    choice, as the serving block's own messages do: the YAML never said 8192."""
    loaded = load_config_dict({"profiles": {"whole": {"chunked_prefill": False}}})
    fitted = EngineConfig(StaticConfig(max_model_len=8192),
                          loaded.config.live.replace(max_num_batched_tokens=4096))
    with pytest.raises(ValueError, match=re.escape(
            "profiles.whole: max_num_batched_tokens=4096 must be >= max_model_len (8192,"
            " fitted to the model)")):
        check_profiles(loaded.profiles, fitted, fitted={"max_model_len"})


def test_missing_or_broken_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_config_file(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("serving: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config_file(broken)


def test_live_config_is_frozen_and_replace_makes_a_new_snapshot():
    live = LiveConfig()
    with pytest.raises(AttributeError):
        live.max_num_seqs = 3  # type: ignore[misc]
    smaller = live.replace(max_num_seqs=3)
    assert (live.max_num_seqs, smaller.max_num_seqs) == (128, 3)
    EngineConfig(StaticConfig(), smaller).validate()
    with pytest.raises(ValueError, match="lane.name"):
        LaneConfig("bad name!").validate()
