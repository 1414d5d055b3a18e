"""Logprobs and prompt logprobs from the engine (engine/logprobs.py), against a direct
forward of the tiny checkpoint through transformers: the raw model distribution, whatever
the sampling settings, the batch, chunked prefill, the prefix cache or a preemption."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import make_engine

from engine import LLM, SamplingParams
from engine.execution.sampler import sample
from engine.models import load_model
from engine.output.processor import OutputProcessor

PROMPTS = ["The scheduler picks the running decodes first, then prefill chunks",
           "Hello world! How are you today?", "Each block"]


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    torch.set_num_threads(2)
    return load_model(tiny_llama_dir, dtype="float32", keep_reference=True)  # vs transformers


def reference_logprobs(loaded, ids: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits over the whole sequence: [len(ids), V]."""
    with torch.inference_mode():
        logits = loaded.reference(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def encode(loaded, text: str) -> list[int]:
    return loaded.tokenizer.encode(text, add_special_tokens=False)


def check_entry(entry, token_id: int, ref_row: torch.Tensor, top_n: int) -> None:
    """entry: a decoded Logprob for `token_id` at a position whose reference is ref_row
    (a prompt entry has its rank, a sampled one none)."""
    assert entry.token_id == token_id
    assert entry.logprob == pytest.approx(float(ref_row[token_id]), abs=1e-4)
    rank = int((ref_row > ref_row[token_id]).sum()) + 1
    assert entry.rank in (rank, None)
    values, ids = torch.topk(ref_row, top_n)
    assert [t for t, _, _ in entry.top] == ids.tolist()
    assert [lp for _, _, lp in entry.top] == pytest.approx(values.tolist(), abs=1e-4)
    assert [lp for _, _, lp in entry.top] == sorted((lp for _, _, lp in entry.top),
                                                     reverse=True)


def test_greedy_logprobs_equal_a_direct_forward(loaded):
    llm = LLM(loaded, num_kv_blocks=256)
    ids = [encode(loaded, p) for p in PROMPTS]
    params = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=n)
              for n in (5, 0)] + [SamplingParams(max_tokens=8, temperature=0.0)]  # no logprobs
    outs = llm.generate(ids, params, use_tqdm=False)
    assert outs[2].logprobs is None
    for out, prompt, n in zip(outs[:2], ids[:2], (5, 0), strict=True):
        assert len(out.logprobs) == len(out.token_ids) == 8
        ref = reference_logprobs(loaded, prompt + out.token_ids)
        for i, (entry, token) in enumerate(zip(out.logprobs, out.token_ids, strict=True)):
            check_entry(entry, token, ref[len(prompt) - 1 + i], n)
            assert entry.rank is None  # not computed for sampled tokens
            assert int(ref[len(prompt) - 1 + i].argmax()) == token  # greedy: the top entry
            assert entry.token == loaded.tokenizer.decode([token])
            if n:
                assert entry.top[0][0] == token


def test_logprobs_are_of_the_raw_distribution_before_processors(loaded):
    """Temperature, top-k and penalties change which token is drawn, not its logprob."""
    llm = LLM(loaded, num_kv_blocks=256)
    prompt = encode(loaded, PROMPTS[0])
    params = SamplingParams(max_tokens=10, temperature=1.7, top_k=40, seed=11,
                            repetition_penalty=1.8, presence_penalty=1.0, ignore_eos=True,
                            logprobs=3)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    ref = reference_logprobs(loaded, prompt + out.token_ids)
    for i, (entry, token) in enumerate(zip(out.logprobs, out.token_ids, strict=True)):
        check_entry(entry, token, ref[len(prompt) - 1 + i], 3)
    argmaxes = [int(ref[len(prompt) - 1 + i].argmax()) for i in range(len(out.token_ids))]
    assert argmaxes != out.token_ids  # hot sampling left the argmax sometimes


def prompt_logprobs(loaded, prompts: list[list[int]], n: int = 4, **engine):
    llm = LLM(loaded, **engine)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                            prompt_logprobs=n, logprobs=2)
    return llm, llm.generate(prompts, params, use_tqdm=False)


def test_prompt_logprobs_equal_a_full_sequence_forward(loaded):
    prompts = [encode(loaded, p) for p in PROMPTS]
    _, outs = prompt_logprobs(loaded, prompts, num_kv_blocks=256)
    for prompt, out in zip(prompts, outs, strict=True):
        assert len(out.prompt_logprobs) == len(prompt) - 1  # the first token has none
        ref = reference_logprobs(loaded, prompt)
        for i, entry in enumerate(out.prompt_logprobs):
            check_entry(entry, prompt[i + 1], ref[i], 4)
            assert entry.rank is not None


@pytest.mark.parametrize("regime", [
    {"prefill_chunk_size": 5, "max_num_batched_tokens": 16},  # several chunks per prompt
    {"num_kv_blocks": 6, "block_size": 8, "kv_cache_high_watermark": 0.99,
     "kv_cache_reject_watermark": 1.0},  # too few blocks: requests preempted, recomputed
])
def test_chunked_or_preempted_prefill_gives_the_same_prompt_logprobs(loaded, regime):
    prompts = [encode(loaded, p) for p in PROMPTS]
    _, whole = prompt_logprobs(loaded, prompts, num_kv_blocks=256)
    llm, parts = prompt_logprobs(loaded, prompts, **{"num_kv_blocks": 64, **regime})
    if "block_size" in regime:
        assert sum(out.record.num_preemptions for out in parts) > 0
    for a, b in zip(whole, parts, strict=True):
        assert [e.token_id for e in a.prompt_logprobs] == [e.token_id for e in b.prompt_logprobs]
        assert [e.logprob for e in a.prompt_logprobs] == pytest.approx(
            [e.logprob for e in b.prompt_logprobs], abs=1e-5)
        assert [[t for t, _, _ in e.top] for e in a.prompt_logprobs] == [
            [t for t, _, _ in e.top] for e in b.prompt_logprobs]
        assert a.token_ids == b.token_ids and len(b.logprobs) == len(b.token_ids)
        assert [e.logprob for e in a.logprobs] == pytest.approx(
            [e.logprob for e in b.logprobs], abs=1e-5)


def test_prompt_logprobs_bypass_the_prefix_cache(loaded):
    """A cached prefix would skip positions: the request computes its whole prompt (as
    vLLM), while a request without prompt logprobs still hits the cache."""
    prompt = encode(loaded, " ".join(PROMPTS * 2))
    assert len(prompt) > 32  # two full blocks of 16
    llm = LLM(loaded, num_kv_blocks=256)
    greedy = SamplingParams(max_tokens=2, temperature=0.0)
    llm.generate([prompt], greedy, use_tqdm=False)  # fills the cache
    bm = llm.engine.block_manager
    hits = bm.prefix_hit_tokens
    asking = llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0,
                                                   prompt_logprobs=1), use_tqdm=False)[0]
    assert bm.prefix_hit_tokens == hits and asking.record.num_cached_tokens == 0
    assert len(asking.prompt_logprobs) == len(prompt) - 1
    ref = reference_logprobs(loaded, prompt)
    for i, entry in enumerate(asking.prompt_logprobs):
        check_entry(entry, prompt[i + 1], ref[i], 1)
    plain = llm.generate([prompt], greedy, use_tqdm=False)[0]
    assert plain.record.num_cached_tokens >= 32


def test_a_prefill_recomputed_after_a_preemption_scores_only_the_new_positions(loaded):
    """Preempted mid-prompt, a request computes its prompt again from position 0: the
    positions it scored before are not scored twice, so its prompt logprobs stay one entry
    per prompt token, each of its own position."""
    from engine.execution.model_runner import ModelRunner
    from engine.kv.block_manager import BlockManager
    from engine.records import PrefillChunk, SchedulerOutput
    from engine.request import Request

    prompt = encode(loaded, PROMPTS[0])
    assert len(prompt) > 10
    runner, bm = ModelRunner(loaded, 8, 16), BlockManager(8, 16)
    req = Request("r", prompt, SamplingParams(max_tokens=2, temperature=0.0,
                                              prompt_logprobs=1), 0.0)

    def prefill(num_tokens: int, step_id: int) -> None:
        assert bm.allocate(req, num_tokens)
        chunk = PrefillChunk(req, num_tokens, sample=False)
        sampled = runner.execute(SchedulerOutput(step_id, [], [chunk], 0, 64))
        req.prompt_logprobs.extend(sampled.prompt_logprobs["r"])
        req.num_computed_tokens += num_tokens

    prefill(6, 1)  # positions 0..5 score tokens 1..6
    bm.free(req)  # preempted: its K/V is gone, computed again from the start
    req.num_computed_tokens = 0
    prefill(10, 2)  # positions 0..9: only 6..9 are new
    assert [e.token_id for e in req.prompt_logprobs] == prompt[1:11]
    ref = reference_logprobs(loaded, prompt)
    assert [e.logprob for e in req.prompt_logprobs] == pytest.approx(
        [float(ref[i, t]) for i, t in enumerate(prompt[1:11])], abs=1e-4)


def test_once_its_prompt_is_scored_a_recompute_hits_the_prefix_cache_again():
    """Prompt logprobs bypass the cache only while some prompt position is unscored: a
    request preempted after its prompt was scored takes its prefix from the cache."""
    from engine.kv.block_manager import BlockManager
    from engine.logprobs import TokenLogprob
    from engine.request import Request

    bm = BlockManager(16, 4)
    req = Request("r", list(range(10, 19)), SamplingParams(max_tokens=4, prompt_logprobs=1),
                  0.0)
    assert bm.allocate_prefix(req) == 0 and req.needs_prompt_logprobs
    assert bm.allocate(req, 9)
    req.num_computed_tokens = 9
    req.prompt_logprobs.extend(TokenLogprob(t, -1.0, 1) for t in req.token_ids[1:])
    bm.cache_full_blocks(req)
    req.token_ids.append(30)  # its first output token
    assert not req.needs_prompt_logprobs  # all 8 positions scored
    bm.free(req)  # preempted
    req.num_computed_tokens = 0
    assert bm.allocate_prefix(req) == 8  # its two full blocks, from the cache


def test_a_step_without_logprobs_scores_nothing(monkeypatch):
    def no_scoring(*args, **kwargs):
        raise AssertionError("score_rows ran for a step where no row asked")

    monkeypatch.setattr("engine.execution.sampler.score_rows", no_scoring)
    from engine.request import Request

    requests = [Request(str(i), [1, 2], SamplingParams(temperature=t, seed=i), 0.0)
                for i, t in enumerate((0.0, 1.0))]
    result = sample(torch.randn(2, 50), requests)
    assert len(result) == 2 and result.logprobs is None and result.prompt_logprobs == {}


def test_logprobs_of_the_asking_rows_in_a_mixed_batch_are_of_their_sampled_tokens():
    """Only some rows ask (their own scoring path): each entry is of the token that row
    sampled, under a temperature that often leaves the argmax."""
    from engine.request import Request

    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    requests = [Request("a", [1], SamplingParams(temperature=0.0), 0.0),
                Request("b", [1], SamplingParams(temperature=5.0, seed=3, logprobs=2), 0.0),
                Request("c", [1], SamplingParams(temperature=5.0, seed=4), 0.0)]
    ref = torch.log_softmax(logits, dim=-1)
    left_the_argmax = []
    for _ in range(20):
        out = sample(logits.clone(), requests)
        entry = out.logprobs[1]
        assert out.logprobs[0] is None and out.logprobs[2] is None
        assert entry.token_id == out[1]
        assert entry.logprob == pytest.approx(float(ref[1, out[1]]), abs=1e-5)
        left_the_argmax.append(out[1] != int(logits[1].argmax()))
    assert any(left_the_argmax)


class LetterTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def test_an_executor_without_a_model_returns_no_logprobs():
    """The simulator samples no distribution: the request runs to its end, its logprobs
    reported as None (the API refuses such requests with a 400 instead)."""
    engine, _ = make_engine()
    processor = OutputProcessor(LetterTokenizer())
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    prompt_ids = list(range(5, 25))
    assert engine.add_request("a", prompt_ids, params).accepted
    processor.add("a", None, prompt_ids, params)
    outs = [out for step in engine.run_until_done() for out in processor.process(step)[0]]
    assert outs[-1].finished and len(outs[-1].token_ids) == 4
    assert outs[-1].logprobs is None and outs[-1].prompt_logprobs is None
    assert not getattr(engine.executor, "computes_logprobs", False)
    engine.check_integrity()


@pytest.mark.parametrize("value", [-1, 21, 2.5, True])
@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
def test_bad_logprob_counts_are_refused_naming_the_field(name, value):
    with pytest.raises(ValueError, match=f"{name}="):
        SamplingParams(**{name: value})
