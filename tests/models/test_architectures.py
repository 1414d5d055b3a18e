"""Each supported architecture and rope type against transformers, built in memory.

The transformers model is built from a tiny config and seeded weights; its state dict is
loaded into ours with build_model (the loader's path), then a prompt runs in chunks
through the paged cache.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.paged import PagedHarness, chunks, hf_logits
from fixtures.tiny_models import build_hf_model, make_config

from engine.models import architecture_of, build_model, get_model_class

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
CASES = {
    "mistral-sliding-window": ("mistral", {"sliding_window": 4096}),
    "llama-llama3-rope-biases": ("llama", {"rope_parameters": LLAMA3_ROPE,
                                           "attention_bias": True, "mlp_bias": True}),
    "llama-linear-rope-untied": ("llama", {"rope_parameters": {"rope_type": "linear",
                                                               "rope_theta": 500.0,
                                                               "factor": 4.0}}),
    # head_dim set apart from hidden_size // heads (Mistral Nemo: 5120 hidden, 32 x 128)
    "llama-head-dim-wider-than-hidden-over-heads": ("llama", {"head_dim": 32}),
    "qwen2-linear-rope-tied": ("qwen2", {"tie_word_embeddings": True,
                                         "rope_parameters": {"rope_type": "linear",
                                                             "rope_theta": 1e6,
                                                             "factor": 2.0}}),
}
TOKENS = [(i * 37 + 11) % 500 for i in range(70)]  # past original_max_position_embeddings


@pytest.mark.parametrize("case", list(CASES))
def test_architecture_matches_transformers(case):
    arch, overrides = CASES[case]
    config = make_config(arch, **overrides)
    reference = build_hf_model(config, seed=99)
    model = build_model(get_model_class(architecture_of(config)), config,
                        reference.state_dict(), torch.float32, torch.device("cpu"))
    harness = PagedHarness(model, num_blocks=40, block_size=8, seed=5)
    ours = torch.cat([harness.step({"s": c})["s"] for c in chunks(TOKENS, [13, 29, 1])])
    expected = hf_logits(reference, TOKENS)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_bf16_model_stays_close_to_fp32():
    config = make_config("llama")
    reference = build_hf_model(config, seed=7)
    state = reference.state_dict()
    cls = get_model_class("LlamaForCausalLM")
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(cls, config, state, dtype, torch.device("cpu"))
        harness = PagedHarness(model, block_size=4, seed=1)
        logits[dtype] = torch.cat([harness.step({"s": c})["s"] for c in chunks(TOKENS, [20])])
    assert logits[torch.bfloat16].dtype == torch.float32  # compute_logits upcasts
    torch.testing.assert_close(logits[torch.bfloat16], logits[torch.float32], atol=0.5, rtol=0.05)

