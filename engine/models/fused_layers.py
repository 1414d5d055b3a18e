"""Steps of the Llama family with the work between projections fused (kernels/cpu_elementwise.py).

For a step the native decode layers do not take (a prefill chunk in it, or more decodes
than they run) on the bf16 weight copies, `run_fused_layers` runs the decoder layers with
torch's projections (oneDNN, AMX) and each stretch between two of them in one native call:

    h = rmsnorm(x) * ln1                      (the previous layer's last call)
    qkv = qkv_proj(h);  q, cache <- rope_store(qkv)       RoPE, k and v into the cache
    out = the attention backend's paged_attention(q, ...)
    x += o_proj(out);  h = rmsnorm(x) * ln2               add_rmsnorm
    act = silu_mul(gate_up_proj(h));  x += down_proj(act); h = rmsnorm(x) * next ln1

instead of ~18 torch ops a layer, each a full pass over a [T, D] or [T, I] tensor (on a
2046-token prefill they took ~40% of the step). It returns False, having done nothing,
when the step is not one it takes: not on the bf16 copies (FUSE_FLOAT32_STEPS), the
native library does not build here, the activations are not float32 on CPU, the layer is
too wide for the kernels, the attention backend is not "cpu", the caches are not all
float32 or all bfloat16 and contiguous, or some slot of the step is not inside the cache
(C writes raw memory).
tests/kernels/test_cpu_elementwise.py holds it to the torch layers within rounding.
"""

from __future__ import annotations

import torch

from engine.models.attention import AttentionMetadata, KVCache
from kernels import cpu_elementwise, native_library

# NOTE: float32 steps keep torch's ops: they are what the token-for-token parity tests
# against transformers run, and the fused calls sum in another order (within 2e-5, not
# bit for bit). Tests set this to check the wiring at float32 precision.
FUSE_FLOAT32_STEPS = False


def run_fused_layers(model, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                     kv_caches: list[KVCache], meta: AttentionMetadata, bf16: bool) -> bool:
    """x: float32 [T, D] embeddings -> the last layer's output, in place (True); or False
    with nothing done."""
    layers = model.model.layers
    if not ((bf16 or FUSE_FLOAT32_STEPS) and x.device.type == "cpu"
            and x.dtype == torch.float32 and x.is_contiguous() and cpu_elementwise.available()
            and _layer_fits(model) and layers[0].self_attn.attn.backend.name == "cpu"
            and _caches_and_slots_ok(kv_caches, meta.slot_mapping)):
        return False
    rows = x.shape[0]
    cos, ssin = (t.reshape(rows, -1).contiguous() for t in rope)  # float32, as x
    act = torch.bfloat16 if bf16 else torch.float32
    eps = layers[0].input_layernorm.eps
    h = cpu_elementwise.add_rmsnorm(x, None, layers[0].input_layernorm.weight, eps, act)
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(layers, kv_caches, strict=True)):
        attn = layer.self_attn
        qkv = attn.qkv_proj(h, bf16)
        q = cpu_elementwise.rope_store(qkv, k_cache, v_cache, meta.slot_mapping, cos, ssin,
                                       attn.num_heads)
        out = attn.attn.backend.paged_attention(  # "cpu": o_proj's input dtype, as written
            q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.query_start_loc,
            attn.attn.scale, meta.max_query_len, meta.max_context_len, out_dtype=act)
        delta = attn.o_proj(out.reshape(rows, -1), bf16)
        h = cpu_elementwise.add_rmsnorm(x, delta, layer.post_attention_layernorm.weight, eps,
                                        act)
        delta = layer.mlp.down_proj(cpu_elementwise.silu_mul(layer.mlp.gate_up_proj(h, bf16)),
                                    bf16)
        following = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else None
        h = cpu_elementwise.add_rmsnorm(x, delta, following, eps, act)
    return True


def _layer_fits(model) -> bool:
    attn = model.model.layers[0].self_attn
    return cpu_elementwise.takes(model.config.hidden_size, model.config.intermediate_size,
                                 attn.num_heads, attn.num_kv_heads, attn.head_dim)


def _caches_and_slots_ok(kv_caches: list[KVCache], slots: torch.Tensor) -> bool:
    k0 = kv_caches[0][0]
    if k0.dtype not in (torch.float32, torch.bfloat16) or not all(
            k.dtype == v.dtype == k0.dtype and k.is_contiguous() and v.is_contiguous()
            and k.shape == k0.shape and v.shape == k0.shape for k, v in kv_caches):
        return False
    return native_library.slots_inside(slots, k0)
