"""Prefix-cache hit counters count a hit when a request starts with it (issue 17, item 6):
a request held back by the KV high watermark looks its prefix up again every step, and
each of those tries used to count as hits."""

from __future__ import annotations

from engine_helpers import Driver, live_config, make_engine, prompt

from engine.config import LaneConfig
from engine.request import SamplingParams

SYSTEM = prompt(99, 64)  # 4 full blocks of 16


def test_a_request_held_back_by_the_watermark_counts_its_prefix_hit_once():
    # 16 blocks, no new start past 8 used (watermark 0.5) while anything runs.
    live = live_config((LaneConfig("interactive"),), max_num_seqs=8,
                       kv_cache_high_watermark=0.5)
    engine, _ = make_engine(live, num_kv_blocks=16)
    d = Driver(engine)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    d.add("warm", SYSTEM + prompt(1, 8), params)  # caches SYSTEM's 4 blocks
    d.run()
    # `hog` holds 5 blocks for 10 decode steps: 5 used + 4 cached hits + 1 new > 8.
    d.add("hog", prompt(2, 70), SamplingParams(max_tokens=10, ignore_eos=True))
    d.step()
    d.add("user", SYSTEM + prompt(3, 8), params)
    d.run()

    steps_user_waited = sum(1 for o in d.outputs if o.record is not None
                            and o.record.decisions.waiting_by_reason.get("kv_high_watermark"))
    assert steps_user_waited >= 5  # it was held back (the scenario is what it says)
    record = d.finished_records()["user"]
    assert record.num_cached_tokens == 64
    assert d.steps_of("user")[0][0] >= d.steps_of("hog")[0][0] + 5
    step_hits = [o.record.prefix_hit_tokens for o in d.outputs if o.record is not None]
    step_queries = [o.record.prefix_query_tokens for o in d.outputs if o.record is not None]
    # warm: 64 queried, 0 hit; hog: 64 queried (70 tokens), 0 hit; user: 64 of 64, once.
    assert sum(step_hits) == 64, step_hits
    assert sum(step_queries) == 64 * 3, step_queries
    bm = engine.block_manager
    assert (bm.prefix_hit_tokens, bm.prefix_query_tokens) == (64, 192)
