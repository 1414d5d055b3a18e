"""Every decoder layer of a small decode step in one native call (kernels/cpu_layers.c).

A decode step of a few rows is weight streaming plus, per layer, ~15 small torch ops and
~10 module calls; on two threads each op is a dispatch and a thread hand-off. The native
call runs all layers in one OpenMP region and reads each weight row once for all rows.
engine/models/native_decode.py decides per step whether it applies (else the model's torch
layers run) and hands over the tensors; this module only lays them out for C.

The layer table (one C struct of pointers per layer, layer_table) is made by the caller
and may be reused while the same tensors stay alive: native_decode keeps it with the
tensors it was made from and reuses it while a step passes the very same tensors.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, fields

import torch

from kernels import native_library

MAX_ROWS = 64  # MAX_ROWS of cpu_layers.c: the most rows decode_layers takes
# The most rows of a step that engine/models/native_decode.py runs here. The torch side
# multiplies on oneDNN's prepacked bf16 weights (engine/models/projections.py), or, for a
# GGUF model's Q4_1 blocks, on the AMX kernel over them (kernels/cpu_amx_q4.c), with the
# work between projections fused (engine/models/fused_layers.py). Whole engine steps,
# bench/native_layers_ab.py, SmolLM2-135M, 2 threads, ms at 1 / 4 / 8 / 12 / 16 rows:
# native on the bf16 copies 13.6 / 21.0 / 28.7 / 34.1 / 38.9 against torch on the packed
# copies 20.8 / 22.0 / 23.8 / 25.5 / 27.2: the native bf16 layers win up to 4 rows (1.05x
# there). On the GGUF blocks, ms at 1 / 4 / 6 / 7 / 8 / 16 rows: native 10.3 / 14.1 / 16.3
# / 17.1 / 18.5 / 29.0, torch on the AMX kernel 15.4 / 16.6 / 17.2 / 18.0 / 18.4 / 20.9:
# the blocks natively up to 7 rows (1.05x there, even at 8). Since the GEMVs read their
# weights WEIGHT_PREFETCH_BYTES ahead (kernels/cpu_vector_math.h), ms at 1 / 2 / 3 / 4 / 6
# / 8 rows: native bf16 14.5 / 14.9 / 15.7 / 16.2 / 17.3 / 18.7 against torch on the packed
# copies 14.7 / 15.7 / 16.3 / 15.9 / 16.7 / 17.4 (even at 4), the blocks natively 7.3 /
# 8.2 / 10.1 / 10.7 / 12.1 / 14.5, further ahead of torch than before: both bounds stand.
NATIVE_MAX_ROWS = 4
NATIVE_GGUF_MAX_ROWS = 7
# Steps of these many rows run natively on a GGUF model's Q4_1 AMX tiles
# (Projection.weight_tiles) where it has them: the projections' inputs rounded to bf16 as
# on the torch side, the rest of the layer in float32. bench/native_layers_ab.py, ms at 2 /
# 3 / 4 / 8 / 16 / 32 / 64 rows, both reading their weights WEIGHT_PREFETCH_BYTES ahead
# (kernels/cpu_vector_math.h): tiles 8.2 / 9.2 / 9.5 / 11.2 / 15.0 / 21.8 / 40.8, the
# blocks in float32 7.8 / 8.9 / 9.9 / 14.5 / - / - / -; before that read-ahead the tiles
# took 11.5 ms at 2 rows and 45.5 at 64, torch on the tiles 16.7 / 46.9. Up to 3 rows the
# blocks are faster, and float32.
NATIVE_TILES_MIN_ROWS = 4
NATIVE_TILES_MAX_ROWS = MAX_ROWS
# lm_head through project_rows up to this many rows (native_decode.native_logits), SmolLM2's
# 57 MB head streamed from memory, ms at 1 / 2 / 4 / 8 rows: the bf16 copy natively 2.6 /
# 3.1 / 3.5 / 5.0, its Q8_0 blocks 2.2 / 2.5 / 3.0 / 3.8, oneDNN on the packed copy 2.7 /
# 2.7 / 2.8 / 2.9 (flat: it reads the packed weight once for all rows).
NATIVE_LOGITS_MAX_ROWS = 1
NATIVE_GGUF_LOGITS_MAX_ROWS = 2
# False: the torch layers always (A/B runs, tests of the torch path).
NATIVE_LAYERS = True
# Weight formats of the kernel (weights_format of cpu_layers.c): float32, bfloat16, and
# GGUF blocks (uint8 [out, row_bytes], kernels/cpu_quant_dot.c), by their GGUF type name;
# and Q4_1 blocks in the AMX kernel's tiles (Projection.weight_tiles, kernels/cpu_amx_q4.c)
FORMAT_FLOAT32, FORMAT_BFLOAT16 = 0, 1
GGUF_FORMATS = {"Q4_1": 2, "Q8_0": 3}
FORMAT_Q4_TILES = 4

_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64
_local = threading.local()  # .seq_rows: {rows: int32 arange}


def available() -> bool:
    """Whether small decode steps run natively here (NATIVE_LAYERS on and the library
    builds; the first call may compile it, ~1 s once per machine)."""
    return NATIVE_LAYERS and native_library.load() is not None


@dataclass(frozen=True)
class LayerTensors:
    """One decoder layer as the kernel reads it: weights [out, in] contiguous, all float32,
    all bfloat16, all uint8 rows of GGUF blocks of one format, or all Q4_1 AMX tiles (uint8,
    kernels/cpu_amx_q4.py `pack`); biases float32 [out] or None; norms float32 [D]; caches
    contiguous [num_blocks, block_size, kvh, d], float32 or bfloat16 (every layer's the
    same)."""

    qkv_w: torch.Tensor
    o_w: torch.Tensor
    gate_up_w: torch.Tensor
    down_w: torch.Tensor
    qkv_b: torch.Tensor | None
    o_b: torch.Tensor | None
    gate_up_b: torch.Tensor | None
    down_b: torch.Tensor | None
    ln1: torch.Tensor
    ln2: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor


class _Layer(ctypes.Structure):
    _fields_ = [(f.name, _PTR) for f in fields(LayerTensors)]  # the order of bp_layer


class _Step(ctypes.Structure):  # bp_step
    _fields_ = [*((name, _I64) for name in (
        "rows", "hidden", "heads", "kv_heads", "head_dim", "inter", "block_size",
        "table_stride", "weights_format", "num_threads", "cache_bf16")),
        *((name, _PTR) for name in ("cos", "ssin", "slots", "tables", "ctx", "seq_rows",
                                    "scratch")),
        ("eps", ctypes.c_float), ("scale", ctypes.c_float)]


@dataclass(frozen=True)
class Dims:
    """The model's sizes: hidden D, query / KV heads, head_dim d, intermediate I."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps: float
    scale: float


@dataclass(frozen=True)
class LayerTable:
    """The kernel's view of a model's layers: one bp_layer struct of raw pointers each."""

    structs: ctypes.Array
    block_size: int
    weights_format: int
    cache_bf16: int  # 1: the caches are bfloat16


def weights_format_of(weight: torch.Tensor, gguf_type: str | None = None,
                      tiled: bool = False) -> int:
    """The kernel's format code of a weight: Q4_1 tiles (`tiled`, uint8), its GGUF block
    type for uint8 block rows, else by dtype (float32 or bfloat16). ValueError for anything
    else."""
    if tiled and weight.dtype == torch.uint8 and gguf_type == "Q4_1":
        return FORMAT_Q4_TILES
    if not tiled and weight.dtype == torch.uint8 and gguf_type in GGUF_FORMATS:
        return GGUF_FORMATS[gguf_type]
    if weight.dtype in (torch.float32, torch.bfloat16) and gguf_type is None:
        return FORMAT_FLOAT32 if weight.dtype == torch.float32 else FORMAT_BFLOAT16
    raise ValueError(f"weight of dtype {weight.dtype} with {gguf_type=} ({tiled=}) must be"
                     f" float32, bfloat16, uint8 blocks of one of {sorted(GGUF_FORMATS)}, or"
                     " uint8 tiles of Q4_1")


def layer_table(layers: list[LayerTensors], gguf_type: str | None = None,
                tiled: bool = False) -> LayerTable:
    """The table of `layers`, whose weights are uint8 blocks of `gguf_type` (`tiled`: Q4_1
    in the AMX tiles), else float32 or bfloat16. It holds no reference to the tensors: the
    caller keeps them alive and in place while the table is used."""
    structs = (_Layer * len(layers))()
    for entry, layer in zip(structs, layers, strict=True):
        for f in fields(layer):
            tensor = getattr(layer, f.name)
            setattr(entry, f.name, None if tensor is None else tensor.data_ptr())
    cache = layers[0].k_cache
    if cache.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"KV caches of dtype {cache.dtype}: float32 or bfloat16 only")
    return LayerTable(structs, cache.shape[1],
                      weights_format_of(layers[0].qkv_w, gguf_type, tiled),
                      int(cache.dtype == torch.bfloat16))


def _seq_rows(rows: int) -> torch.Tensor:
    cache = getattr(_local, "seq_rows", None)
    if cache is None:
        cache = _local.seq_rows = {}
    if rows not in cache:
        cache[rows] = torch.arange(rows, dtype=torch.int32)
    return cache[rows]


def decode_layers(table: LayerTable, dims: Dims, x: torch.Tensor, cos: torch.Tensor,
                  ssin: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor) -> None:
    """Run the layers of `table` over x in place. x float32 contiguous [T, D], T <=
    MAX_ROWS, row t the decode of sequence t; cos, ssin float32 contiguous [T, d]; slots
    int64 [T] (each a valid slot of the caches); block_tables int32 [T, max_blocks] with
    unit column stride and context_lens int32 [T], contiguous, whose blocks lie in the
    caches (the caller checks: C reads raw memory)."""
    rows = x.shape[0]
    qkv_width = (dims.heads + 2 * dims.kv_heads) * dims.head_dim
    floats = rows * (dims.hidden + qkv_width + dims.heads * dims.head_dim + 3 * dims.inter)
    if table.weights_format == FORMAT_Q4_TILES:  # a projection's bf16 inputs, 16-row groups
        widest = max(dims.hidden, dims.heads * dims.head_dim, dims.inter)
        floats += -(-rows // 16) * 16 * widest // 2
    scratch = torch.empty(floats, dtype=torch.float32)
    seq_rows = _seq_rows(rows)
    step = _Step(rows, dims.hidden, dims.heads, dims.kv_heads, dims.head_dim, dims.inter,
                 table.block_size, block_tables.stride(0), table.weights_format,
                 torch.get_num_threads(), native_library.cache_mode(bool(table.cache_bf16)),
                 cos.data_ptr(), ssin.data_ptr(), slots.data_ptr(), block_tables.data_ptr(),
                 context_lens.data_ptr(), seq_rows.data_ptr(), scratch.data_ptr(),
                 dims.eps, dims.scale)
    status = native_library.load().bp_decode_layers(table.structs, len(table.structs),
                                                ctypes.byref(step), x.data_ptr())
    if status != 0:
        raise ValueError(f"{rows=} and {dims} are outside the native kernel's limits"
                         f" (rows <= {MAX_ROWS}, heads <= {native_library.MAX_HEADS},"
                         f" heads * head_dim <= {native_library.MAX_HEADS_X_DIM}, even head_dim;"
                         " GGUF blocks: hidden, heads * head_dim and inter multiples of 32;"
                         " tiles: and every projection's outputs of 16, AMX granted)")


def project_rows(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor,
                 gguf_type: str | None = None) -> torch.Tensor:
    """x float32 contiguous [T, K] (T <= MAX_ROWS) @ weight.T (+ bias) -> float32 [T, N],
    by the layers' GEMV; weight [N, K] float32 or bfloat16, or uint8 [N, row_bytes] blocks
    of `gguf_type` holding rows of K weights, contiguous; bias float32 [N]."""
    (rows, in_features), code = x.shape, weights_format_of(weight, gguf_type)
    _check_row_width(weight, code, in_features)
    out = torch.empty(rows, weight.shape[0], dtype=torch.float32)
    status = native_library.load().bp_project_rows(
        weight.data_ptr(), code, None if bias is None else bias.data_ptr(), x.data_ptr(),
        rows, in_features, weight.shape[0], out.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise ValueError(f"{rows=} must be in 1..{MAX_ROWS} (native projection)")
    return out


def dequantize_rows(blocks: torch.Tensor, gguf_type: str, in_features: int) -> torch.Tensor:
    """uint8 [N, row_bytes] blocks of `gguf_type` -> the float32 weights [N, in_features]
    they hold (as the GEMV decodes them). ValueError when the sizes do not match."""
    code = weights_format_of(blocks, gguf_type)
    _check_row_width(blocks, code, in_features)
    blocks = blocks.contiguous()
    out = torch.empty(blocks.shape[0], in_features, dtype=torch.float32)
    native_library.load().bp_dequantize_rows(code, blocks.data_ptr(), blocks.shape[0],
                                         in_features, out.data_ptr())
    return out


def _check_row_width(weight: torch.Tensor, code: int, in_features: int) -> None:
    """ValueError unless weight's rows ([N, K] values, or [N, row_bytes] blocks of format
    `code`) hold in_features weights each (blocks: a multiple of 32)."""
    width = (in_features if code in (FORMAT_FLOAT32, FORMAT_BFLOAT16)
             else native_library.load().bp_quant_row_bytes(code, in_features))
    if weight.dim() != 2 or width < 0 or weight.shape[1] != width:
        raise ValueError(f"weight of shape {tuple(weight.shape)} (format {code}) must hold"
                         f" rows of {in_features=} (blocks: a multiple of 32)")
