"""The Llama family on the paged KV cache: Llama, SmolLM2 (a Llama), Qwen2, Mistral.

Module names equal transformers' (model.embed_tokens, model.layers.N.self_attn.q_proj, ...,
lm_head), so a transformers state dict loads as is. The family differs only in biases:

    Llama    q/k/v/o bias = config.attention_bias, MLP bias = config.mlp_bias
    Qwen2    q/k/v bias, o without
    Mistral  no bias (its sliding window is not applied: LoadedModel.max_model_len caps
             contexts at the window, where full attention is exact)

Shapes: T flattened tokens of the step, nh / kvh query / KV heads, d head_dim, D hidden.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.attention import Attention, AttentionMetadata, KVCache
from engine.models.rope import RotaryEmbedding, apply_rotary


class RMSNorm(nn.Module):
    """x / rms(x) * weight, in float32 then back to x.dtype (the transformers order)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SelfAttention(nn.Module):
    """q/k/v projections, RoPE, paged attention, output projection."""

    def __init__(self, config: Any, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=o_bias)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim,
                              scale=self.head_dim**-0.5)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache, meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)  # [T, nh, d]
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, kvh, d]
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = self.attn(q, k, v, kv_cache, meta)  # [T, nh, d]
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, config: Any, qkv_bias: bool, o_bias: bool, mlp_bias: bool) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config, qkv_bias, o_bias)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache, meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: Any, qkv_bias: bool, o_bias: bool, mlp_bias: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, qkv_bias, o_bias, mlp_bias)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config, head_dim_of(config))


class LlamaForCausalLM(nn.Module):
    """A causal LM that runs one flattened, mixed prefill/decode step on the paged cache."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={config.hidden_act!r} is not supported (only 'silu')")
        self.config = config
        qkv_bias, o_bias, mlp_bias = self.biases(config)
        self.model = LlamaModel(config, qkv_bias, o_bias, mlp_bias)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share embed_tokens' weight with lm_head when the config ties them. Call again
        after load_state_dict(assign=True) or to_empty(): both replace parameters one by one."""
        if getattr(self.config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def biases(config: Any) -> tuple[bool, bool, bool]:
        """(q/k/v bias, o bias, MLP bias) for this architecture."""
        attention_bias = bool(getattr(config, "attention_bias", False))
        return attention_bias, attention_bias, bool(getattr(config, "mlp_bias", False))

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_key_value_heads

    @property
    def head_dim(self) -> int:
        return head_dim_of(self.config)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor,
        kv_caches: list[KVCache], meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions: int [T] -> hidden states [T, D] after the final norm.

        Writes each layer's K/V for the T tokens into kv_caches[layer] at meta.slot_mapping.
        """
        if len(kv_caches) != self.num_layers:
            raise ValueError(f"got {len(kv_caches)} KV caches for {self.num_layers} layers")
        x = self.model.embed_tokens(input_ids)  # [T, D]
        rope = self.model.rotary_emb(positions, x.dtype)  # cos, sin: [T, d]
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, rope, kv_cache, meta)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, D] (the rows to sample from) -> float32 logits [R, vocab]."""
        return self.lm_head(hidden).float()


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def biases(config: Any) -> tuple[bool, bool, bool]:
        return True, False, False


class MistralForCausalLM(LlamaForCausalLM):
    @staticmethod
    def biases(config: Any) -> tuple[bool, bool, bool]:
        return False, False, False


def head_dim_of(config: Any) -> int:
    """config.head_dim when set, else hidden_size // num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
