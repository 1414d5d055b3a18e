"""The go-live checklist's checks of the serving config (control/checklist/checks_config.py) at
their edges: a value exactly at a limit passes, one just past it fails naming it, and the
spec's parameters (a minimum, a share of the pool, tenants to route) are the ones judged.
The plain pass and fail of each item: test_checklist.py."""

from __future__ import annotations

from tests.control.checklist.evidence import good, result, set_evidence, spec_with


def test_a_limit_set_exactly_to_its_minimum_passes():
    ev = good()
    set_evidence(ev, "config.max_waiting_requests", 1)  # the spec's minimum: 1
    set_evidence(ev, "config.queue_timeout_ms", 1)
    got = result(ev, "limits_set")
    assert got.status == "pass", got.evidence
    assert "max_waiting_requests 1, queue_timeout_ms 1" in got.evidence
    # and the minimum is the spec's: 64 sequences pass a minimum of 64, not of 65
    spec = spec_with("limits_set", min={"max_num_seqs": 64})
    assert result(good(), "limits_set", spec).status == "pass"
    got = result(good(), "limits_set", spec_with("limits_set", min={"max_num_seqs": 65}))
    assert got.status == "fail" and "max_num_seqs 64 < 65" in got.evidence


def test_a_lane_capped_above_max_num_seqs_fails_as_no_cap():
    """A batch lane allowed 100 running sequences on a server that runs 64 is not capped:
    it can still take every sequence."""
    ev = good()
    set_evidence(ev, "config.lanes.batch.max_running", 100)
    got = result(ev, "limits_set")
    assert got.status == "fail"
    assert "lanes.batch.max_running 100 > max_num_seqs 64: no limit" in got.evidence


def test_a_config_without_the_batch_lane_passes_and_says_so():
    # nothing to cap, but the reviewer is told the lane the spec asks about is absent
    ev = good()
    del ev.config["lanes"]["batch"]
    got = result(ev, "limits_set")
    assert got.status == "pass", got.evidence
    assert got.evidence.endswith("; lane(s) batch not configured")


def test_a_reject_watermark_past_the_whole_pool_fails_and_the_whole_pool_passes():
    ev = good()
    set_evidence(ev, "config.kv_cache_reject_watermark", 1.2)  # would never reject
    got = result(ev, "watermarks")
    assert got.status == "fail"
    assert "kv_cache_reject_watermark 1.2: must be 0 < high < reject <= 1" in got.evidence
    set_evidence(ev, "config.kv_cache_reject_watermark", 1.0)
    assert result(ev, "watermarks").status == "pass"


def test_a_chunk_exactly_one_steps_budget_passes():
    ev = good()
    set_evidence(ev, "config.prefill_chunk_size", 4096)  # == max_num_batched_tokens
    got = result(ev, "chunked_prefill")
    assert got.status == "pass", got.evidence
    assert got.evidence.endswith("max_num_batched_tokens 4096: a chunk fits one step")
    set_evidence(ev, "config.prefill_chunk_size", 4097)
    assert result(ev, "chunked_prefill").status == "fail"


def test_the_specs_budget_share_of_the_kv_pool_is_the_limit_judged():
    ev = good()
    set_evidence(ev, "static.num_kv_blocks", 400)  # 6400 tokens; the budget is 4096
    assert result(ev, "budget_fits_kv").status == "pass"
    got = result(ev, "budget_fits_kv", spec_with("budget_fits_kv", max_budget_share=0.5))
    assert got.status == "fail"
    assert "max_num_batched_tokens 4096 > 3200 tokens (0.5 x the KV pool)" in got.evidence


def test_more_sequences_than_kv_blocks_fails_even_when_the_budget_fits():
    """Each running sequence holds at least one block: 64 sequences over 32 blocks (512
    tokens, more than the 256-token budget) cannot all run."""
    ev = good()
    set_evidence(ev, "static.num_kv_blocks", 32)
    set_evidence(ev, "config.max_num_batched_tokens", 256)
    got = result(ev, "budget_fits_kv")
    assert got.status == "fail"
    assert got.evidence.startswith("max_num_seqs 64 > num_kv_blocks 32: each sequence needs")


def test_each_tenant_the_spec_names_must_be_routed_to_a_lane():
    spec = spec_with("lanes", tenants=["acme"])
    got = result(good(), "lanes", spec)  # tenant_lanes {}
    assert got.status == "fail" and "tenant(s) acme not routed" in got.evidence
    ev = good()
    ev.config["tenant_lanes"] = {"acme": "interactive"}
    got = result(ev, "lanes", spec)
    assert got.status == "pass" and got.evidence.endswith("; tenants acme -> interactive")


def test_a_lane_with_a_ttft_target_but_no_tpot_target_fails_slo_set():
    # goodput counts a token stream against both: without TPOT, slow streams count as good
    ev = good()
    ev.config["lanes"]["interactive"]["slo"] = {"ttft_s": 1.0, "tpot_s": None}
    got = result(ev, "slo_set")
    assert got.status == "fail"
    assert "lanes.interactive.slo has no tpot_s" in got.evidence
    assert "no ttft_s" not in got.evidence
