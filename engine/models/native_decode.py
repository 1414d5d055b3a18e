"""Small decode steps of the Llama family through the native layers (kernels/cpu_layers.py).

`run_native_decode` runs every decoder layer of a step in one native call when the step
is what that kernel takes, and returns False, having done nothing, otherwise (the model's
torch layers then run). It takes a step when:

- the native library builds here (kernels/native_library.py) and kernels.cpu_layers.NATIVE_LAYERS;
- the model's attention backend is "cpu" (another one, asked for, is honoured);
- every row is one sequence's decode (one query token each), at most NATIVE_MAX_ROWS rows
  (NATIVE_GGUF_MAX_ROWS on GGUF blocks; NATIVE_TILES_MIN_ROWS..NATIVE_TILES_MAX_ROWS on the
  AMX tiles of Q4_1 blocks, where engine/models/gguf_blocks.py made them);
- the activations are float32 on CPU, the KV caches contiguous and all float32 or all
  bfloat16 (kv_cache_dtype);
- the weights the step uses are all GGUF blocks of one type where the model keeps them
  (engine/models/gguf_blocks.py: they decode to the float32 weights exactly), else all
  float32, or all bf16 copies (model.uses_bf16);
- every slot and every block the decodes own lies inside the caches (C reads raw memory).

The arithmetic is the torch layers' (engine/models/llama.py) in float32, in another
summation order: tests/kernels/test_cpu_layers.py holds the two within float32 rounding. On
the tiles each projection's input is rounded to bf16 first, as the torch layers' bf16 steps
do (tests/kernels/test_cpu_amx_q4.py).
"""

from __future__ import annotations

import operator
import threading
import weakref
from dataclasses import dataclass

import torch

from engine.models.attention import AttentionMetadata, KVCache
from kernels import cpu_amx_q4, cpu_layers, native_library
from kernels.cpu_plan import attention_plan


def run_native_decode(model, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                      kv_caches: list[KVCache], meta: AttentionMetadata, bf16: bool) -> bool:
    """x: float32 [T, D] embeddings -> the last layer's output, in place (True); or False
    with nothing done when the step is not one the native layers take."""
    rows, gguf_type = x.shape[0], model.gguf_layers_type
    view = _model_view(model)
    tiled = _uses_tiles(view, gguf_type, rows)
    max_rows = (cpu_layers.NATIVE_TILES_MAX_ROWS if tiled else cpu_layers.NATIVE_GGUF_MAX_ROWS
                if gguf_type else cpu_layers.NATIVE_MAX_ROWS)
    if not (cpu_layers.NATIVE_LAYERS and x.device.type == "cpu" and x.dtype == torch.float32
            and 1 <= rows <= max_rows and meta.max_query_len == 1
            and meta.num_seqs == rows and x.is_contiguous()
            and model.model.layers[0].self_attn.attn.backend.name == "cpu"):
        return False
    kind = ("weight_tiles" if tiled else "weight_gguf" if gguf_type
            else "weight_bf16" if bf16 else "weight")
    table = (None if view.dims is None
             else _layer_table(view.sources, kv_caches, kind, gguf_type))
    if table is None or native_library.load() is None or not _metadata_ok(meta, kv_caches[0][0]):
        return False
    cos, ssin = (t.reshape(rows, -1).contiguous() for t in rope)  # float32, as x
    cpu_layers.decode_layers(table, view.dims, x, cos, ssin, meta.slot_mapping,
                             meta.block_tables, meta.context_lens)
    return True


def _uses_tiles(view: _ModelView, gguf_type: str | None, rows: int) -> bool:
    """Whether a step of `rows` decodes multiplies on the layers' Q4_1 AMX tiles
    (cpu_layers.NATIVE_TILES_MIN_ROWS .. NATIVE_TILES_MAX_ROWS rows, where
    engine/models/gguf_blocks.py tiled them), rather than on the blocks in float32. Read
    from the view's buffer dicts: a module attribute walk costs ~1 us a lookup a step."""
    return (cpu_layers.NATIVE_TILES_MIN_ROWS <= rows <= cpu_layers.NATIVE_TILES_MAX_ROWS
            and gguf_type == "Q4_1" and cpu_amx_q4.ENABLED
            and view.sources[0][1].get("weight_tiles") is not None)  # qkv_proj's buffers


def native_logits(model, hidden: torch.Tensor) -> torch.Tensor | None:
    """lm_head of a small step by the native layers' GEMV: float32 logits [R, vocab], or
    None (nothing done) where it does not apply. On its GGUF blocks where it keeps them,
    else on the weights the step would use (the bf16 copy on a bf16 step), with float32
    activations."""
    rows, head = hidden.shape[0], model.lm_head
    if head.weight_gguf is not None:
        weight, gguf_type = head.weight_gguf, head.gguf_type
        max_rows = cpu_layers.NATIVE_GGUF_LOGITS_MAX_ROWS
    else:
        weight = head.weight_bf16 if model.uses_bf16(rows) else head.weight
        gguf_type, max_rows = None, cpu_layers.NATIVE_LOGITS_MAX_ROWS
    if not (cpu_layers.NATIVE_LAYERS and hidden.device.type == "cpu"
            and hidden.dtype == torch.float32 and hidden.is_contiguous()
            and 1 <= rows <= max_rows and weight is not None and weight.is_contiguous()
            and (gguf_type is not None or weight.dtype in (torch.float32, torch.bfloat16))
            and native_library.load() is not None):
        return None
    return cpu_layers.project_rows(weight, head.bias, hidden, gguf_type)


def _metadata_ok(meta: AttentionMetadata, k_cache: torch.Tensor) -> bool:
    """Every row a decode of its own sequence, its slot and its blocks inside the cache,
    and the index tensors laid out as the kernel reads them."""
    tables, ctx, slots = meta.block_tables, meta.context_lens, meta.slot_mapping
    if not (tables.dtype == ctx.dtype == torch.int32 and tables.stride(1) == 1
            and ctx.is_contiguous() and native_library.slots_inside(slots, k_cache)):
        return False
    plan = attention_plan(len(slots), tables, ctx, meta.query_start_loc, k_cache.shape[1])
    ids = plan.decode_block_ids
    return bool(plan.all_decodes and ids is not None and ids[0] >= 0
                and ids[1] < k_cache.shape[0])


_local = threading.local()  # .layers: {kind: (key tensors, C table) of its last step}


@dataclass(frozen=True)
class _ModelView:
    """What a model's native steps read from it, made once per model: per layer the
    parameter / buffer dicts of its projections and norms (plain dicts: nn.Module
    attribute lookups cost ~1 us each, ~500 a step), and its sizes (None: outside the
    kernel's limits)."""

    sources: list[tuple[dict, ...]]
    dims: cpu_layers.Dims | None


_views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _ModelView


def _model_view(model) -> _ModelView:
    if model not in _views:
        layers = model.model.layers
        sources = [
            (*(d for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                              layer.mlp.gate_up_proj, layer.mlp.down_proj)
               for d in (proj._parameters, proj._buffers)),
             layer.input_layernorm._parameters, layer.post_attention_layernorm._parameters)
            for layer in layers]
        attn = layers[0].self_attn
        dims = cpu_layers.Dims(model.config.hidden_size, attn.num_heads, attn.num_kv_heads,
                               attn.head_dim, model.config.intermediate_size,
                               layers[0].input_layernorm.eps, attn.attn.scale)
        fits = (dims.heads <= native_library.MAX_HEADS and dims.head_dim % 2 == 0
                and dims.heads * dims.head_dim <= native_library.MAX_HEADS_X_DIM)
        _views[model] = _ModelView(sources, dims if fits else None)
    return _views[model]


def _layer_table(sources: list[tuple[dict, ...]], kv_caches: list[KVCache], kind: str,
                 gguf_type: str | None):
    """The kernel's layer table for the weights of `kind` ("weight", "weight_bf16",
    "weight_gguf": blocks of gguf_type, or "weight_tiles"), or None when some weight is
    missing or in another dtype than the rest, or a tensor is not laid out as the kernel
    reads it. Checked once per set of tensors: a step passing the very same tensors as the
    last of its kind reuses its table (the cache holds the tensors, so their ids cannot be
    reused)."""
    buffer = kind != "weight"  # the copies and blocks are buffers, the weight a parameter
    key = []
    for (qp, qb, op, ob, gp, gb, dp, db, ln1, ln2), (k_cache, v_cache) in zip(
            sources, kv_caches, strict=True):
        key += ((qb if buffer else qp)[kind], qp["bias"], (ob if buffer else op)[kind],
                op["bias"], (gb if buffer else gp)[kind], gp["bias"],
                (db if buffer else dp)[kind], dp["bias"], ln1["weight"], ln2["weight"],
                k_cache, v_cache)
    tables = getattr(_local, "layers", None)
    if tables is None:
        tables = _local.layers = {}
    cached = tables.get(kind)
    if cached is not None and len(cached[0]) == len(key) and all(
            map(operator.is_, cached[0], key)):
        return cached[1]
    dtype = {"weight": torch.float32, "weight_bf16": torch.bfloat16}.get(kind, torch.uint8)
    layers = _checked_layers(key, dtype)
    table = None if layers is None else cpu_layers.layer_table(
        layers, gguf_type, tiled=kind == "weight_tiles")
    tables[kind] = (key, table)
    return table


def _checked_layers(key: list, weight_dtype: torch.dtype) -> list[cpu_layers.LayerTensors] | None:
    """LayerTensors from the flat key (per layer: 4 x (weight, bias), 2 norms, 2 caches)."""
    layers = []
    for i in range(0, len(key), 12):
        weights, biases = key[i:i + 8:2], key[i + 1:i + 8:2]
        norms, caches = key[i + 8:i + 10], key[i + 10:i + 12]
        if any(w is None or w.dtype != weight_dtype or not w.is_contiguous() for w in weights):
            return None
        if any(t is not None and (t.dtype != torch.float32 or not t.is_contiguous())
               for t in (*biases, *norms)):
            return None
        if any(c.dtype not in (torch.float32, torch.bfloat16) or c.dtype != key[10].dtype
               or not c.is_contiguous() for c in caches):
            return None  # every layer's caches float32, or every layer's bfloat16
        layers.append(cpu_layers.LayerTensors(*weights, *biases, *norms, *caches))
    return layers
