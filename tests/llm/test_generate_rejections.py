"""Issue 17.5: `LLM.generate` waits for room only while requests in flight can make it; a
rejection that cannot clear raises with its reason instead of looping forever, and leaves
the LLM usable."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.llm import PromptRejected
from engine.models import load_model
from engine.request import Request

MAX_STEPS = 5_000  # far more than any of these runs needs: past it, generate is looping


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    llm = LLM(load_model(tiny_llama_dir), num_kv_blocks=16)
    engine_step = llm.engine.step
    steps = [0]

    def bounded_step():
        steps[0] += 1
        if steps[0] > MAX_STEPS:
            raise RuntimeError("LLM.generate is looping on a rejection that cannot clear")
        return engine_step()

    llm.engine.step = bounded_step
    llm.steps = steps
    return llm


@pytest.fixture(autouse=True)
def _fresh_step_count(llm):
    llm.steps[0] = 0


def test_max_waiting_requests_zero_is_refused_up_front(tiny_llama_dir):
    with pytest.raises(ValueError, match="max_waiting_requests=0 must be >= 1"):
        LLM(load_model(tiny_llama_dir), num_kv_blocks=16, max_waiting_requests=0)


def test_a_full_kv_cache_on_an_idle_engine_raises_instead_of_waiting(llm):
    bm = llm.engine.block_manager
    squatter = Request("squatter", [5], SamplingParams(), 0.0)  # KV nothing will free
    assert bm.allocate(squatter, bm.num_blocks * bm.block_size)
    try:
        with pytest.raises(PromptRejected, match="kv_reject_watermark") as exc:
            llm.generate(["Hello", "The scheduler"], SamplingParams(max_tokens=2),
                         use_tqdm=False)
        assert exc.value.decision.reason == "kv_reject_watermark"
        assert exc.value.index == 0
    finally:
        bm.free(squatter)
    outs = llm.generate("Hello", SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    assert len(outs[0].token_ids) == 2


def test_a_permanent_rejection_mid_batch_ends_the_batch_cleanly(llm):
    capacity = llm.engine.static.num_kv_blocks * llm.engine.static.block_size  # 256 tokens
    params = [SamplingParams(max_tokens=8), SamplingParams(max_tokens=capacity)]
    with pytest.raises(PromptRejected, match="prompt 1 rejected \\(too_long\\)"):
        llm.generate(["Hello", "Hello"], params, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()  # prompt 0 did not stay behind
    llm.engine.check_integrity()
    assert llm.engine.block_manager.num_used == 0
    outs = llm.generate(["Hello"] * 3, SamplingParams(max_tokens=2), use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [2, 2, 2]
