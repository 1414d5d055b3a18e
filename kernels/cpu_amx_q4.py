"""Decode steps' projections on AMX over GGUF Q4_1 and Q8_0 weights (kernels/cpu_amx_q4.c).

`pack` turns a projection's Q4_1 blocks (engine/models/gguf_blocks.py keeps them as uint8
[N, K / 32 * 20]), or the head's Q8_0 blocks, into the kernel's tiled layout once at load
(kernels/cpu_amx_tiles.c); `matmul` multiplies up to MAX_ROWS activation rows by it, in
bf16 with float32 sums, reading 5 (Q4_1) or 8.5 (Q8_0) bits a weight where oneDNN reads
the 16-bit copy. The weights it decodes are bit for bit the model's bf16
copies (tests/kernels/test_cpu_amx_q4.py), so the result is the bf16 path's in another
summation order. The native decode layers (kernels/cpu_layers.c) multiply on the same tiles
for steps of NATIVE_TILES_MIN_ROWS..NATIVE_TILES_MAX_ROWS rows.
"""

from __future__ import annotations

import torch

from kernels import native_library
from kernels.cpu_layers import GGUF_FORMATS

MAX_ROWS = 64  # MAX_GROUPS x 16 of cpu_amx_q4.c
# False: projections that keep tiles multiply on oneDNN's bf16 copy (A/B runs, tests).
ENABLED = True
TILE_BYTES = {"Q4_1": 320, "Q8_0": 544}  # per 16 x 32 weights (kernels/cpu_amx_tiles.c)
_PREFIX = {"Q4_1": "bp_q4", "Q8_0": "bp_q8"}  # the library's functions for each


def available() -> bool:
    """Whether the library built with AMX here and the OS grants this process its tiles."""
    lib = native_library.load()
    return lib is not None and lib.bp_q4_amx_ready() == 1


def packs(out_features: int, in_features: int) -> bool:
    """Whether a [out, in] weight fits the tiled layout (16-row, 32-column tiles)."""
    return out_features % 16 == 0 and in_features % 32 == 0


def pack(blocks: torch.Tensor, in_features: int, gguf_type: str = "Q4_1") -> torch.Tensor:
    """uint8 [N, K / 32 * block bytes] rows of gguf_type (Q4_1 or Q8_0) blocks -> uint8
    [N / 16 * K / 32 * TILE_BYTES], the tiled layout."""
    rows, lib = blocks.shape[0], native_library.load()
    if (gguf_type not in TILE_BYTES or not packs(rows, in_features)
            or blocks.shape[1] != lib.bp_quant_row_bytes(GGUF_FORMATS[gguf_type], in_features)):
        raise ValueError(f"{gguf_type} blocks {tuple(blocks.shape)} for {in_features} inputs"
                         f" do not tile (Q4_1 or Q8_0, rows a multiple of 16, inputs of 32)")
    blocks = blocks.contiguous()
    out = torch.empty(rows // 16 * in_features // 32 * TILE_BYTES[gguf_type], dtype=torch.uint8)
    getattr(lib, f"{_PREFIX[gguf_type]}_tile_pack")(blocks.data_ptr(), rows, in_features,
                                                   out.data_ptr())
    return out


def unpack(tiles: torch.Tensor, out_features: int, in_features: int,
           gguf_type: str = "Q4_1") -> torch.Tensor:
    """The float32 weights [N, K] a tiled matrix holds (tests)."""
    out = torch.empty(out_features, in_features, dtype=torch.float32)
    getattr(native_library.load(), f"{_PREFIX[gguf_type]}_tile_unpack")(
        tiles.data_ptr(), out_features, in_features, out.data_ptr())
    return out


def matmul(x: torch.Tensor, tiles: torch.Tensor, out_features: int,
           gguf_type: str = "Q4_1", out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """x [M, K] (1 <= M <= MAX_ROWS, any float dtype) @ W.T -> bf16 [M, N], W the weights
    tiled from gguf_type blocks; out_dtype float32: those bf16 values widened, written by
    the kernel (as .float() of the bf16 result, without its pass over the rows: logits).
    ValueError outside the kernel's limits."""
    rows, in_features = x.shape
    groups = -(-rows // 16)
    if rows % 16 == 0 and x.dtype == torch.bfloat16 and x.is_contiguous():
        a = x  # whole 16-row groups as they are: no copy on the step's path
    else:
        a = torch.zeros(groups * 16, in_features, dtype=torch.bfloat16)  # rows past M: zeros
        a[:rows] = x
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype {out_dtype}: bfloat16 or float32")
    out = torch.empty(rows, out_features, dtype=out_dtype)
    status = getattr(native_library.load(), f"{_PREFIX[gguf_type]}_amx_matmul")(
        a.data_ptr(), rows, in_features, tiles.data_ptr(), out_features, out.data_ptr(),
        int(out_dtype == torch.float32), torch.get_num_threads())
    if status != 0:
        raise ValueError(f"{rows} rows x {in_features} -> {out_features}: outside the AMX "
                         f"kernel (1..{MAX_ROWS} rows, tiles of 16 x 32, AMX granted)")
    return out
