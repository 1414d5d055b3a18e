"""The Llama family on the paged KV cache: Llama, SmolLM2 (a Llama), Qwen2, Mistral.

Module names equal transformers' (model.embed_tokens, model.layers.N.self_attn..., lm_head)
except two fused projections per layer, `self_attn.qkv_proj` (q, k, v rows stacked) and
`mlp.gate_up_proj` (gate, up): load hooks fuse transformers' q/k/v_proj and gate/up_proj
on load and state_dict() splits them back (projections.py), so a transformers state dict
loads as is and a saved one is a transformers checkpoint. The family differs only in biases:

    Llama    q/k/v/o bias = config.attention_bias, MLP bias = config.mlp_bias
    Qwen2    q/k/v bias, o without
    Mistral  no bias (its sliding window is not applied: LoadedModel.max_model_len caps
             contexts at the window, where full attention is exact)

Shapes: T flattened tokens of the step, nh / kvh query / KV heads, d head_dim, D hidden,
I intermediate.

Precision per step (CPU "auto", engine/models/cpu_dtype.py): with `bf16_min_rows` set, a
step of at least that many tokens runs its projections (and SwiGLU's silu(gate) * up) on
bf16 copies of the weights (compute_logits: that many rows); the residual stream, norms,
RoPE, attention and the KV cache stay float32. Small decode steps run every layer in one
native call (engine/models/native_decode.py); other bf16 steps run the work between the
projections in native calls (engine/models/fused_layers.py); the rest run the modules below.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.attention import Attention, AttentionMetadata, KVCache
from engine.models.fused_layers import run_fused_layers
from engine.models.native_decode import native_logits, run_native_decode
from engine.models.projections import Projection, fuse_parts_on_load
from engine.models.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    """x / rms(x) * weight, in float32 then back to x.dtype (the transformers order)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused kernel, bit-equal to the lines below in fp32
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one [2 * I, D] projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = Projection(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = Projection(intermediate_size, hidden_size, bias=bias)
        fuse_parts_on_load(self, "gate_up_proj", ("gate_proj", "up_proj"),
                           (intermediate_size, intermediate_size))

    def forward(self, x: torch.Tensor, bf16: bool = False) -> torch.Tensor:
        gate, up = self.gate_up_proj(x, bf16).split(self.intermediate_size, dim=-1)  # [T, I]
        return self.down_proj(F.silu(gate) * up, bf16)


class SelfAttention(nn.Module):
    """q/k/v projections, RoPE, paged attention, output projection."""

    def __init__(self, config: Any, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Projection(hidden, q_size + 2 * kv_size, bias=qkv_bias)
        self.o_proj = Projection(q_size, hidden, bias=o_bias)
        fuse_parts_on_load(self, "qkv_proj", ("q_proj", "k_proj", "v_proj"),
                           (q_size, kv_size, kv_size))
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim,
                              scale=self.head_dim**-0.5)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache, meta: AttentionMetadata, bf16: bool = False,
    ) -> torch.Tensor:
        num_tokens, nh, kvh = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x, bf16).view(num_tokens, nh + 2 * kvh, self.head_dim)
        # q and k rotate as one [T, nh + kvh, d] tensor (half the elementwise ops); q and
        # k are then strided views of it, v a strided view of qkv (bf16 on a bf16 step:
        # the rotation's fp32 tables promote q and k, the cache write casts v).
        qk = rotate(qkv[:, : nh + kvh], *rope)
        q, k, v = qk[:, :nh], qk[:, nh:], qkv[:, nh + kvh:]
        out = self.attn(q, k, v, kv_cache, meta)  # [T, nh, d]
        return self.o_proj(out.reshape(num_tokens, nh * self.head_dim), bf16)


class DecoderLayer(nn.Module):
    def __init__(self, config: Any, qkv_bias: bool, o_bias: bool, mlp_bias: bool) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config, qkv_bias, o_bias)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache, meta: AttentionMetadata, bf16: bool = False,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta, bf16)
        return x + self.mlp(self.post_attention_layernorm(x), bf16)


class LlamaModel(nn.Module):
    def __init__(self, config: Any, qkv_bias: bool, o_bias: bool, mlp_bias: bool) -> None:
        super().__init__()
        # NOTE: built on the meta device and given the checkpoint's weights (loader.py), so
        # no random init: nn.Embedding's own normal_ on meta cost the process's first call
        # ~1.3 s of CPU (torch importing its decompositions) at every server start
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size))
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
        self.lm_head = Projection(config.hidden_size, config.vocab_size, bias=False)
        # Steps of at least this many tokens (logits: rows) use the bf16 weight copies;
        # None: never. Set by keep_bf16_copies().
        self.bf16_min_rows: int | None = None
        # The block type of the GGUF blocks every decoder projection keeps (Q4_1, ...);
        # None: none. Set by engine/models/gguf_blocks.attach_gguf_blocks().
        self.gguf_layers_type: str | None = None
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share embed_tokens' weight with lm_head when the config ties them. Call again
        after load_state_dict(assign=True) or to_empty(): both replace parameters one by one."""
        if getattr(self.config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def keep_bf16_copies(self, min_rows: int | None) -> None:
        """Keep a bf16 copy of every projection's weight (and lm_head's) for steps of at
        least `min_rows` tokens; None drops them. Costs 2 bytes per projection parameter
        (SmolLM2-135M: ~270 MB next to ~540 MB of fp32 weights). Call after loading."""
        if min_rows is not None and min_rows < 1:
            raise ValueError(f"{min_rows=} must be >= 1 (or None: no bf16 copies)")
        for module in self.modules():
            if isinstance(module, Projection):
                module.keep_bf16_copy(min_rows is not None)
        self.bf16_min_rows = min_rows

    def uses_bf16(self, rows: int) -> bool:
        """Whether a step (or a logits call) of `rows` rows runs on the bf16 copies."""
        return self.bf16_min_rows is not None and rows >= self.bf16_min_rows

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
        rope = rope_for_rotate(*self.model.rotary_emb(positions, x.dtype))
        bf16 = self.uses_bf16(x.shape[0])
        # small decode steps: every layer native; other steps: native between projections
        if not (run_native_decode(self, x, rope, kv_caches, meta, bf16)
                or run_fused_layers(self, x, rope, kv_caches, meta, bf16)):
            for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
                x = layer(x, rope, kv_cache, meta, bf16)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, D] (the rows to sample from) -> float32 logits [R, vocab]."""
        logits = native_logits(self, hidden)  # a few rows: the native layers' GEMV
        if logits is not None:
            return logits
        return self.lm_head.float_forward(hidden, self.uses_bf16(hidden.shape[0]))


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def biases(config: Any) -> tuple[bool, bool, bool]:
        return True, False, False


class MistralForCausalLM(LlamaForCausalLM):
    @staticmethod
    def biases(config: Any) -> tuple[bool, bool, bool]:
        return False, False, False


def rope_for_rotate(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, d] -> (cos, sin with its first half negated), each [T, 1, d]: made
    once per step so that each layer's rotation is four ops (see rotate)."""
    half = sin.shape[-1] // 2
    return cos[:, None, :], torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)[:, None, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, d] -> apply_rotary(x, cos, sin), bit for bit: rotate_half(x) * sin
    equals roll(x, d / 2) * signed_sin exactly (a sign moves between two factors), and the
    roll replaces two slices, a negation and a cat."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def head_dim_of(config: Any) -> int:
    """config.head_dim when set, else hidden_size // num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
