"""One scenario per story of the engine core (issue 2), on the simulated executor.

Every scenario drives the engine through `Driver`, which checks budgets, block integrity
and the one-finish-per-request contract after every step.
"""

from __future__ import annotations

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt, reference_output

from engine.config import LaneConfig
from engine.request import RequestStatus, SamplingParams

ONE_LANE = (LaneConfig("interactive"),)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def _chat_behind_doc(chunked: bool) -> Driver:
    """A chat decoding, then a 3000-token document and a second chat arrive together."""
    if chunked:
        live = live_config(ONE_LANE, max_num_batched_tokens=256, prefill_chunk_size=128,
                           max_num_seqs=16)
    else:  # every prompt runs whole in one step
        live = live_config(ONE_LANE, max_num_batched_tokens=4096, prefill_chunk_size=4096,
                           chunked_prefill=False, max_num_seqs=16)
    engine, _ = make_engine(live, num_kv_blocks=1024, max_model_len=4096, step_cost_s=1e-3,
                            prefill_token_cost_s=1e-4, decode_token_cost_s=1e-4)
    d = Driver(engine)
    d.add("chat", prompt(1, 16), SamplingParams(max_tokens=40, ignore_eos=True))
    d.step()
    d.step()
    d.add("doc", prompt(2, 3000), SamplingParams(max_tokens=1, ignore_eos=True))
    d.add("chat2", prompt(3, 16), SamplingParams(max_tokens=4, ignore_eos=True))
    d.run()
    return d


def test_short_request_not_stuck_behind_long_prompt():
    chunked, whole = _chat_behind_doc(True), _chat_behind_doc(False)

    doc_steps = [s for s, kind, _ in chunked.steps_of("doc") if kind == "prefill"]
    assert len(doc_steps) >= 3000 // 128  # the document was chunked ...
    chat_steps = {s for s, _, _ in chunked.steps_of("chat")}
    chat_last = max(chat_steps)
    # ... and the running chat decoded in every step the document was prefilling
    assert all(s in chat_steps for s in doc_steps if s <= chat_last)
    chat2_steps = [s for s, _, _ in chunked.steps_of("chat2")]
    assert chat2_steps[0] == doc_steps[0]  # the new chat started next to the first chunk
    assert len([s for s, kind, _ in whole.steps_of("doc") if kind == "prefill"]) == 1

    # What a user sees: the chat's worst inter-token gap and the new chat's TTFT.
    gap_chunked = max(_gaps(chunked.logs["chat"].token_times))
    gap_whole = max(_gaps(whole.logs["chat"].token_times))
    assert gap_chunked <= 1e-3 + 256 * 1e-4 + 1e-9
    assert gap_whole >= 3000 * 1e-4
    assert gap_chunked * 5 < gap_whole
    ttft_chunked = chunked.finished_records()["chat2"].ttft_s
    ttft_whole = whole.finished_records()["chat2"].ttft_s
    assert ttft_chunked * 5 < ttft_whole


def test_cancel_frees_blocks_before_next_step():
    live = live_config(ONE_LANE, max_num_seqs=4, max_num_batched_tokens=256,
                       prefill_chunk_size=128)
    engine, _ = make_engine(live, num_kv_blocks=8, max_model_len=128)
    d = Driver(engine)
    d.add("big", prompt(1, 100), SamplingParams(max_tokens=20, ignore_eos=True))
    d.step()
    d.add("small", prompt(2, 40), SamplingParams(max_tokens=4, ignore_eos=True))
    out = d.step()
    assert "small" not in {rid for rid, _, _ in out.record.scheduled}  # no room for it
    used = engine.kv_snapshot().used
    assert used >= 7

    assert d.abort("big")
    assert engine.kv_snapshot().used == 0  # at once, not at the next step
    assert engine.block_manager.num_free == 8
    engine.check_integrity()
    out = d.step()
    assert "small" in out.record.decisions.admitted  # the freed blocks serve the very next step
    assert ("big", "cancelled") in out.record.finished
    assert [dl.finish_reason for dl in out.deltas if dl.request_id == "big"] == ["cancelled"]

    d.add("queued", prompt(3, 10))
    assert d.abort("queued")  # cancelling a waiting request works too
    assert not d.abort("queued")  # and a second cancel is a no-op, not a crash
    assert not d.abort("never-seen")
    d.run()
    assert d.finished_records()["big"].status == RequestStatus.CANCELLED.name
    assert d.logs["queued"].finish_reason == "cancelled"


def test_high_watermark_holds_new_prefills_until_usage_drops():
    live = live_config(ONE_LANE, max_num_seqs=8, max_num_batched_tokens=512,
                       prefill_chunk_size=512, kv_cache_high_watermark=0.5,
                       kv_cache_reject_watermark=0.95)
    engine, _ = make_engine(live, num_kv_blocks=32, max_model_len=512)
    d = Driver(engine)
    d.add("hog", prompt(1, 300), SamplingParams(max_tokens=30, ignore_eos=True))
    d.step()
    assert engine.block_manager.usage > 0.5
    d.add("next", prompt(2, 20))
    out = d.step()
    assert out.record.decisions.waiting_by_reason == {"kv_high_watermark": 1}
    d.run()
    hog_end = max(s for s, _, _ in d.steps_of("hog"))
    next_start = min(s for s, _, _ in d.steps_of("next"))
    assert next_start == hog_end + 1  # it waited for the usage to drop, then ran at once


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preempted_request_resumes_with_the_same_tokens(prefix_caching):
    live = live_config(ONE_LANE, max_num_seqs=4, max_num_batched_tokens=128,
                       prefill_chunk_size=128)
    engine, _ = make_engine(live, num_kv_blocks=8, max_model_len=128,
                            enable_prefix_caching=prefix_caching)
    d = Driver(engine)
    params = SamplingParams(max_tokens=60)
    d.add("first", prompt(1, 40), params)
    d.add("second", prompt(2, 40), params)
    d.run()
    records = d.finished_records()
    preemptions = records["second"].num_preemptions
    assert preemptions >= 1  # the later arrival gave way
    assert records["first"].num_preemptions == 0
    assert any(rec.decisions.preempted for rec in d.records())
    if not prefix_caching:  # recompute: each resume runs the prompt and outputs again
        prefilled = sum(n for _, kind, n in d.steps_of("second") if kind == "prefill")
        assert prefilled >= 40 * (1 + preemptions)

    alone, _ = make_engine(num_kv_blocks=256, max_model_len=128)
    solo = Driver(alone)
    solo.add("second", prompt(2, 40), params)
    solo.run()
    assert d.logs["second"].tokens == solo.logs["second"].tokens
    assert d.logs["second"].tokens == reference_output(prompt(2, 40), params)


def test_a_preempted_requests_ttft_stays_the_time_of_its_first_token():
    """Resumed by recompute, a preempted request samples again at the end of its re-prefill;
    its TTFT (the record, the metrics, the SLO it is judged by) stays the time its client
    got its first token, not the time it resumed."""
    live = live_config(ONE_LANE, max_num_seqs=4, max_num_batched_tokens=128,
                       prefill_chunk_size=128)
    engine, _ = make_engine(live, num_kv_blocks=8, max_model_len=128,
                            enable_prefix_caching=False, step_cost_s=1e-3)
    d = Driver(engine)
    params = SamplingParams(max_tokens=60)
    d.add("first", prompt(1, 40), params)
    d.add("second", prompt(2, 40), params)
    d.run()
    second = d.finished_records()["second"]
    kinds = [kind for _, kind, _ in d.steps_of("second")]
    assert second.num_preemptions >= 1 and "prefill" in kinds[kinds.index("decode"):]
    first_token = d.logs["second"].token_times[0]
    assert second.first_token_time == pytest.approx(first_token)
    assert second.ttft_s == pytest.approx(first_token - second.arrival_time)


def test_chunked_prefill_off_runs_each_prompt_whole():
    live = live_config(ONE_LANE, chunked_prefill=False, prefill_chunk_size=64,
                       max_num_batched_tokens=1024)
    engine, _ = make_engine(live, max_model_len=1024)
    d = Driver(engine)
    d.add("long", prompt(1, 300))
    d.run()
    assert [(kind, n) for _, kind, n in d.steps_of("long")][0] == ("prefill", 300)


def _steps_to_finish(batching: str) -> tuple[int, Driver]:
    engine, _ = make_engine(live_config(ONE_LANE, max_num_seqs=4, batching=batching),
                            step_cost_s=1e-3)
    d = Driver(engine)
    for i in range(8):
        d.add(f"r{i}", prompt(i, 12), SamplingParams(max_tokens=2 if i % 2 else 30,
                                                     ignore_eos=True))
    return len(d.run()), d


def test_static_batching_takes_more_steps_than_continuous():
    continuous, _ = _steps_to_finish("continuous")
    static, d = _steps_to_finish("static")
    assert static >= 1.5 * continuous
    # static: a batch takes no newcomers; the next forms after all of it has finished
    records = d.finished_records()
    batches: dict[float, list[str]] = {}
    for rid, rec in records.items():
        batches.setdefault(rec.first_scheduled_time, []).append(rid)
    starts = sorted(batches)
    assert len(starts) == 2 and all(len(b) == 4 for b in batches.values())
    assert starts[1] >= max(records[r].finished_time for r in batches[starts[0]])


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_cache_hits_on_shared_system_prompt(prefix_caching):
    engine, _ = make_engine(live_config(ONE_LANE, max_num_seqs=8),
                            enable_prefix_caching=prefix_caching)
    d = Driver(engine)
    system = prompt(99, 64)  # four full blocks of 16
    d.add("u0", system + prompt(0, 10))
    d.run()
    for i in range(1, 4):
        d.add(f"u{i}", system + prompt(i, 10))
    out = d.step()
    shared_step_used = out.record.kv_blocks_used
    d.run()
    records = d.finished_records()
    for i in range(1, 4):
        computed = sum(n for _, kind, n in d.steps_of(f"u{i}") if kind == "prefill")
        if prefix_caching:
            assert records[f"u{i}"].num_cached_tokens == 64
            assert computed == 74 - 64
        else:
            assert records[f"u{i}"].num_cached_tokens == 0
            assert computed == 74
    if prefix_caching:
        assert out.record.prefix_hit_tokens == 3 * 64
        assert shared_step_used == 4 + 3  # the system prompt's blocks are shared
    else:
        assert out.record.prefix_hit_tokens == 0
        assert shared_step_used == 3 * 5
