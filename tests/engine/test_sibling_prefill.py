"""n > 1 in the engine: a later choice (`wait_for`) waits, named `sibling_prefill`, until
the first choice has computed the prompt, then starts from its prefix-cache blocks."""

from __future__ import annotations

from engine_helpers import Driver, live_config, make_engine, prompt

from engine.request import RequestStatus, SamplingParams

PROMPT = prompt(1, 40)  # two full blocks of 16, and 8 tokens more
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def choices(n: int, chunk: int = 512) -> Driver:
    engine, _ = make_engine(live_config(prefill_chunk_size=chunk, max_num_batched_tokens=512))
    driver = Driver(engine)
    driver.add("a", PROMPT, PARAMS)
    for i in range(1, n):
        driver.add(f"a-{i}", PROMPT, PARAMS, wait_for="a")
    return driver


def test_later_choices_wait_then_take_the_prompt_blocks_from_the_cache():
    driver = choices(3)
    first = driver.step()
    assert first.record.prefill_chunks == [("a", 40)]  # the siblings did not start
    assert set(first.record.decisions.waiting_reason_by_lane.values()) == {"sibling_prefill"}
    assert first.record.decisions.waiting_by_reason == {"sibling_prefill": 2}
    bm = driver.engine.block_manager
    hits = bm.prefix_hit_tokens
    second = driver.step()
    assert sorted(second.record.prefill_chunks) == [("a-1", 8), ("a-2", 8)]  # 32 cached
    assert bm.prefix_hit_tokens - hits == 2 * 32
    while driver.engine.has_unfinished_requests():
        driver.step()
    records = {r.request_id: r for out in driver.outputs for r in out.finished}
    assert [records[f"a-{i}"].num_cached_tokens for i in (1, 2)] == [32, 32]
    assert records["a"].num_cached_tokens == 0
    assert all(len(log.tokens) == 4 for log in driver.logs.values())


def test_they_wait_through_a_chunked_prefill():
    driver = choices(2, chunk=16)
    for expected in (("a", 16), ("a", 16), ("a", 8)):
        assert driver.step().record.prefill_chunks == [expected]
    assert driver.step().record.prefill_chunks == [("a-1", 8)]


def test_a_first_choice_that_ends_early_releases_them():
    driver = choices(2)
    driver.abort("a")  # cancelled before it ran: the sibling computes the prompt itself
    out = driver.step()
    assert out.record.prefill_chunks == [("a-1", 40)]
    assert driver.engine.get_request("a-1").status is RequestStatus.RUNNING
