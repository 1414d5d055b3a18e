"""The offline API: seeded sampling, stop strings, EOS handling, chat, bad inputs."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.models import load_model


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    # float32: a seeded request must sample the same tokens alone and in a batch, so its
    # logits must not depend on the step's row count (auto's bf16 path can)
    return LLM(load_model(tiny_llama_dir, dtype="float32"), num_kv_blocks=256)


def test_seeded_sampling_is_the_same_whatever_the_batch(llm):
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    alone = llm.generate("The scheduler", params, use_tqdm=False)[0]
    others = [SamplingParams(max_tokens=n, temperature=0.8, seed=None) for n in (5, 20, 9)]
    batch = llm.generate(["Hello world", "The scheduler", "A request", "The quick"],
                         [others[0], params, others[1], others[2]], use_tqdm=False)
    assert batch[1].token_ids == alone.token_ids
    assert batch[1].text == alone.text
    different = llm.generate("The scheduler", SamplingParams(max_tokens=16, temperature=1.0,
                                                              seed=8), use_tqdm=False)[0]
    assert different.token_ids != alone.token_ids  # the seed matters


def test_stop_string_cuts_text_before_it(llm):
    free = llm.generate("The quick brown", SamplingParams(max_tokens=24, temperature=0.0),
                        use_tqdm=False)[0]
    assert len(free.text) > 12, free.text
    stop = free.text[6:9]
    first = free.text.find(stop)
    stopped = llm.generate("The quick brown", SamplingParams(max_tokens=24, temperature=0.0,
                                                             stop=[stop]), use_tqdm=False)[0]
    assert stopped.text == free.text[:first]
    assert stopped.finish_reason == "stop"
    assert len(stopped.token_ids) < len(free.token_ids)
    assert llm.engine.block_manager.num_used == 0  # its blocks were freed


def test_a_stop_string_ends_the_request_stopped_in_its_record(llm):
    """The engine's record (trace, metrics, outcome) says "stop" too, not "cancelled"."""
    free = llm.generate("The quick brown", SamplingParams(max_tokens=24, temperature=0.0),
                        use_tqdm=False)[0]
    stopped = llm.generate("The quick brown", SamplingParams(
        max_tokens=24, temperature=0.0, stop=[free.text[6:9]]), use_tqdm=False)[0]
    assert stopped.finish_reason == "stop"
    assert stopped.record.finish_reason == "stop" and stopped.record.status == "STOPPED"
    assert stopped.record.outcome == "finished"


def _varied_greedy_output(llm, max_tokens=10):
    """A prompt whose greedy output has a token first seen at index >= 2."""
    for prompt in ("Hello", "The quick brown fox", "Numbers like", "She sells", "A request"):
        free = llm.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0),
                            use_tqdm=False)[0]
        for i, token in enumerate(free.token_ids):
            if i >= 2 and token not in free.token_ids[:i]:
                return prompt, free, i
    raise AssertionError("no prompt gives a varied greedy output")


def test_eos_stops_unless_ignored(llm):
    prompt, free, index = _varied_greedy_output(llm)
    saved = llm.engine.eos_token_id
    try:
        llm.engine.eos_token_id = (free.token_ids[index],)  # pretend this token is EOS
        stops = llm.generate(prompt, SamplingParams(max_tokens=10, temperature=0.0),
                             use_tqdm=False)[0]
        ignores = llm.generate(prompt, SamplingParams(max_tokens=10, temperature=0.0,
                                                      ignore_eos=True), use_tqdm=False)[0]
    finally:
        llm.engine.eos_token_id = saved
    assert stops.finish_reason == "stop" and stops.token_ids == free.token_ids[:index + 1]
    assert ignores.finish_reason == "length" and ignores.token_ids == free.token_ids


def test_stop_token_ids(llm):
    prompt, free, index = _varied_greedy_output(llm)
    out = llm.generate(prompt, SamplingParams(max_tokens=10, temperature=0.0,
                                              stop_token_ids=[free.token_ids[index]]),
                       use_tqdm=False)[0]
    assert out.token_ids == free.token_ids[:index + 1] and out.finish_reason == "stop"


def test_outputs_carry_metrics_in_seconds(llm):
    out = llm.generate(["Hello", "The quick brown fox"],
                       SamplingParams(max_tokens=6, temperature=0.0), use_tqdm=False)
    for o in out:
        m = o.metrics
        assert m is not None and 0 <= m.queue_delay_s <= m.ttft_s <= m.e2e_s < 60
        assert m.tpot_s is not None and m.tpot_s >= 0


def test_chat_uses_the_template(llm):
    messages = [{"role": "user", "content": "Hello"}]
    out = llm.chat(messages, SamplingParams(max_tokens=5, temperature=0.0), use_tqdm=False)[0]
    expected = llm.tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
    assert out.prompt == expected
    assert len(out.token_ids) >= 1


def test_a_tokenizer_that_adds_a_bos_gets_it_as_vllm_gives_it(llm):
    """As vLLM's LLM (and our /v1/completions): a text prompt gets the tokenizer's BOS, a
    chat gets none beyond its template's, token ids go in as given."""
    from tokenizers.processors import TemplateProcessing

    tok = llm.tokenizer
    backend = tok.backend_tokenizer
    bos = tok.convert_tokens_to_ids(tok.bos_token)
    saved = backend.post_processor
    backend.post_processor = TemplateProcessing(single=f"{tok.bos_token} $A",
                                                special_tokens=[(tok.bos_token, bos)])
    messages = [{"role": "user", "content": "Hello"}]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    try:
        plain = tok.encode("The scheduler", add_special_tokens=False)
        text, ids = llm.generate(["The scheduler", plain], params, use_tqdm=False)
        chat = llm.chat(messages, params, use_tqdm=False)[0]
        rendered = tok.encode(chat.prompt, add_special_tokens=False)
    finally:
        backend.post_processor = saved
    assert text.prompt_token_ids == [bos, *plain]
    assert ids.prompt_token_ids == plain
    assert chat.prompt_token_ids == rendered


def test_more_prompts_than_the_queue_holds_all_complete(tiny_llama_dir):
    small = LLM(load_model(tiny_llama_dir), num_kv_blocks=64, max_waiting_requests=3,
                max_num_seqs=2)
    outs = small.generate([f"Hello {i}" for i in range(9)],
                          SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [3] * 9


@pytest.mark.parametrize(("prompt", "params", "message"), [
    ("", SamplingParams(max_tokens=4), "prompt 0 is empty"),
    ("Hello " * 400, SamplingParams(max_tokens=4), "over max_model_len=512"),
    ("Hello", SamplingParams(max_tokens=600), "over max_model_len=512"),
])
def test_bad_inputs_are_clear_errors(llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, params, use_tqdm=False)


def test_a_prompt_that_fills_max_model_len_exactly_runs(llm):
    """prompt + max_tokens may reach max_model_len (512), not pass it."""
    limit = llm.engine.static.max_model_len
    out = llm.generate([[5 + i % 100 for i in range(limit - 4)]],
                       SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    with pytest.raises(ValueError, match=f"{limit + 1} is over max_model_len={limit}"):
        llm.generate([[5] * (limit - 3)], SamplingParams(max_tokens=4), use_tqdm=False)


def test_max_model_len_past_the_models_context_is_capped_to_it(llm):
    from engine.llm import fit_engine_config

    context = llm.loaded.max_model_len
    assert fit_engine_config(llm.loaded, {"max_model_len": context * 4}).static.max_model_len \
        == context
    assert fit_engine_config(llm.loaded, {"max_model_len": 64}).static.max_model_len == 64


def test_bad_params_and_names():
    with pytest.raises(ValueError, match="max_tokens=0 must be an integer >= 1"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="smollm2-135m"):  # lists the aliases
        LLM("meta-llama/Llama-3-8B")
    with pytest.raises(ValueError, match="unknown LLM option"):
        LLM("smollm2-135m", max_num_seq=4)


def test_stop_token_ids_text_matches_the_same_tokens_without_a_stop(llm):
    """As vLLM: a stop token that is not a special token stays in the output, text too."""
    prompt, free, index = _varied_greedy_output(llm)
    stopped = llm.generate(prompt, SamplingParams(max_tokens=10, temperature=0.0,
                           stop_token_ids=[free.token_ids[index]]), use_tqdm=False)[0]
    capped = llm.generate(prompt, SamplingParams(max_tokens=index + 1, temperature=0.0),
                          use_tqdm=False)[0]
    assert stopped.token_ids == capped.token_ids
    assert stopped.text == capped.text and stopped.text != ""
