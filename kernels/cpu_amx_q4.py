"""Mid-sized decode steps' projections on AMX over GGUF Q4_1 weights (kernels/cpu_amx_q4.c).

`pack` turns a projection's Q4_1 blocks (engine/models/gguf_blocks.py keeps them as uint8
[N, K / 32 * 20]) into the kernel's tiled layout once at load; `matmul` multiplies up to
MAX_ROWS activation rows by it, in bf16 with float32 sums, reading 5 bits a weight where
oneDNN reads the 16-bit copy. The weights it decodes are bit for bit the model's bf16
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
TILE_BYTES = 320  # per 16 x 32 weights


def available() -> bool:
    """Whether the library built with AMX here and the OS grants this process its tiles."""
    lib = native_library.load()
    return lib is not None and lib.bp_q4_amx_ready() == 1


def packs(out_features: int, in_features: int) -> bool:
    """Whether a [out, in] weight fits the tiled layout (16-row, 32-column tiles)."""
    return out_features % 16 == 0 and in_features % 32 == 0


def pack(blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """uint8 [N, K / 32 * 20] Q4_1 rows -> uint8 [N / 16 * K / 32 * 320], the tiled layout."""
    rows, lib = blocks.shape[0], native_library.load()
    if (not packs(rows, in_features)
            or blocks.shape[1] != lib.bp_quant_row_bytes(GGUF_FORMATS["Q4_1"], in_features)):
        raise ValueError(f"Q4_1 blocks {tuple(blocks.shape)} for {in_features} inputs do not "
                         f"tile (rows a multiple of 16, inputs of 32)")
    blocks = blocks.contiguous()
    out = torch.empty(rows // 16 * in_features // 32 * TILE_BYTES, dtype=torch.uint8)
    lib.bp_q4_tile_pack(blocks.data_ptr(), rows, in_features, out.data_ptr())
    return out


def unpack(tiles: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """The float32 weights [N, K] a tiled matrix holds (tests)."""
    out = torch.empty(out_features, in_features, dtype=torch.float32)
    native_library.load().bp_q4_tile_unpack(tiles.data_ptr(), out_features, in_features,
                                            out.data_ptr())
    return out


def matmul(x: torch.Tensor, tiles: torch.Tensor, out_features: int) -> torch.Tensor:
    """x [M, K] (1 <= M <= MAX_ROWS, any float dtype) @ W.T -> bf16 [M, N], W the tiled
    weights. ValueError outside the kernel's limits."""
    rows, in_features = x.shape
    groups = -(-rows // 16)
    if rows % 16 == 0 and x.dtype == torch.bfloat16 and x.is_contiguous():
        a = x  # whole 16-row groups as they are: no copy on the step's path
    else:
        a = torch.zeros(groups * 16, in_features, dtype=torch.bfloat16)  # rows past M: zeros
        a[:rows] = x
    out = torch.empty(groups * 16, out_features, dtype=torch.bfloat16)
    status = native_library.load().bp_q4_amx_matmul(
        a.data_ptr(), rows, in_features, tiles.data_ptr(), out_features, out.data_ptr(),
        torch.get_num_threads())
    if status != 0:
        raise ValueError(f"{rows} rows x {in_features} -> {out_features}: outside the AMX "
                         f"kernel (1..{MAX_ROWS} rows, tiles of 16 x 32, AMX granted)")
    return out[:rows]
