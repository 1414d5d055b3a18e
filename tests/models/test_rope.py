"""RoPE settings from both config styles, frequencies equal to transformers', clear refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fixtures.tiny_models import make_config

from engine.models.rope import RotaryEmbedding, apply_rotary, rope_inv_freq, rope_settings

HEAD_DIM = 16


def transformers_inv_freq(config) -> torch.Tensor:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)[0]
    return ROPE_INIT_FUNCTIONS[rope_type](config)[0]


@pytest.mark.parametrize("params", [
    {"rope_type": "default", "rope_theta": 100000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
])
def test_inv_freq_equals_transformers(params):
    config = make_config("llama", rope_parameters=dict(params))
    torch.testing.assert_close(rope_inv_freq(config, HEAD_DIM), transformers_inv_freq(config),
                               atol=0, rtol=0)


def test_old_style_config_with_rope_theta_and_rope_scaling():
    # transformers 4 configs: rope_theta attribute, rope_scaling dict keyed "type"
    config = SimpleNamespace(rope_theta=500.0, rope_scaling={"type": "linear", "factor": 2.0},
                             max_position_embeddings=128)
    assert rope_settings(config) == {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}
    expected = 1.0 / (500.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)) / 2.0
    torch.testing.assert_close(rope_inv_freq(config, HEAD_DIM), expected)
    plain = SimpleNamespace(rope_theta=None, rope_scaling=None, max_position_embeddings=128)
    assert rope_settings(plain) == {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize("rope_type", ["dynamic", "yarn", "longrope"])
def test_unsupported_rope_types_are_refused_by_name(rope_type):
    config = SimpleNamespace(rope_parameters={"rope_type": rope_type, "factor": 2.0},
                             max_position_embeddings=128)
    with pytest.raises(ValueError, match=f"{rope_type}.*default, linear, llama3"):
        rope_inv_freq(config, HEAD_DIM)


def test_partial_rotary_is_refused():
    """Rotating every dimension of a model trained to rotate half of each head would be
    silently wrong text: the load fails instead."""
    config = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                              "partial_rotary_factor": 0.5},
                             max_position_embeddings=128)
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5 is not supported"):
        rope_inv_freq(config, HEAD_DIM)


def test_rotation_preserves_norm_and_relative_position():
    config = make_config("llama")
    rope = RotaryEmbedding(config, HEAD_DIM)
    q, k = torch.randn(1, 2, HEAD_DIM), torch.randn(1, 2, HEAD_DIM)

    def score(pos_q: int, pos_k: int) -> torch.Tensor:
        cos_q, sin_q = rope(torch.tensor([pos_q]), torch.float32)
        cos_k, sin_k = rope(torch.tensor([pos_k]), torch.float32)
        return (apply_rotary(q, cos_q, sin_q) * apply_rotary(k, cos_k, sin_k)).sum(-1)

    cos, sin = rope(torch.tensor([37]), torch.float32)
    torch.testing.assert_close(apply_rotary(q, cos, sin).norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(score(10, 3), score(107, 100), atol=1e-4, rtol=1e-4)
