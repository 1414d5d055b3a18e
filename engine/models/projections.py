"""Linear projections of the Llama family: fused on load, with an optional bf16 twin.

Fusion. A layer runs one `qkv_proj` (q, k, v rows stacked: [(nh + 2 * kvh) * d, D]) and
one `gate_up_proj` ([2 * I, D]) instead of five matmuls. Checkpoints keep transformers'
names: `fuse_parts_on_load` concatenates q/k/v (gate/up) when a state dict is loaded and
splits them back in `state_dict()`, so transformers state dicts load as is and saved
checkpoints stay readable by transformers. Row order is the concatenation order, so the
fused output split at the part sizes equals the separate projections exactly.

bf16 twin (CPU). With AMX or AVX-512-BF16, oneDNN runs a bf16 matmul of 4 or more rows
1.5-2.8x faster than fp32 on SmolLM2's shapes, while at 1-2 rows fp32 weight streaming
is ~10% faster (measured, see docs/architecture.md "Weight dtype on CPU"). A Projection
may keep a bf16 copy of its weight next to the fp32 one; `forward(x, bf16=True)` casts
an fp32 activation in and multiplies on the copy (fp32 accumulation inside oneDNN). The
result stays bf16 (a bias is added in fp32, which makes it fp32): the next fp32 operand
promotes it without a cast op of its own (the residual add, RoPE's fp32 tables, the KV
cache write), and bf16 -> fp32 is exact, so this equals casting back first. Only SwiGLU's
silu(gate) * up runs in bf16, feeding down_proj. Per layer that is 3 casts, not 8: on a
busy 2-core machine every extra parallel op costs a thread hand-off.

Prepacked twin. F.linear on a plain [out, in] bf16 weight makes oneDNN reorder the weight
into its AMX blocked layout on every call. The copy is also kept in that layout once
(`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU freezing uses), and
every step the tiles below do not take multiplies on it: the same products in the same order
(equal bit for bit, tests/models/test_projections_packed.py), ~1.5x faster from 1 to 256
rows on SmolLM2's 30 layers with the weights streamed from memory (23.6 -> 15.9 ms at 64
rows), and 7-18% faster at 700-2048 rows (a layer's four GEMMs at 2048 rows 4.89 -> 4.56 ms,
at 1346 rows 4.01 -> 3.27: oneDNN's plain-weight path also picks worse blockings at some
sizes).

Tiles. A GGUF model whose projections keep Q4_1 blocks (gguf_blocks.py), or whose head keeps
Q8_0 blocks, also keeps them tiled for kernels/cpu_amx_q4.c, and steps of up to
cpu_amx_q4.MAX_ROWS rows multiply on those: 5 (Q4_1) or 8.5 (Q8_0) bits a weight read
instead of 16, decoded to the bf16 copy's values exactly
(SmolLM2's 30 layers: 6.3-6.5 ms at 1-16 rows against oneDNN's 11.4-11.8; at 64 rows
about even, 13.5-16.6 against 16.0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kernels import cpu_amx_q4

# The rows oneDNN is told to expect when it packs (it picks the block layout by them).
PACK_HINT_ROWS = 64
# False: never pack (A/B runs, tests of the plain path).
PACK_WEIGHTS = True


class Projection(nn.Linear):
    """nn.Linear whose weight may have a bf16 copy (`weight_bf16`) and the GGUF blocks it
    was decoded from (`weight_gguf`, uint8 [out, row_bytes] of `gguf_type`, read by the
    native decode layers only: engine/models/gguf_blocks.py); neither is in the state dict."""

    weight_bf16: torch.Tensor | None
    weight_gguf: torch.Tensor | None
    weight_tiles: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("weight_bf16", None, persistent=False)
        self.register_buffer("weight_gguf", None, persistent=False)
        self.gguf_type: str | None = None
        # weight_bf16 in oneDNN's blocked layout (an opaque mkldnn tensor), or None. Not a
        # buffer: module.to() and state_dict() must not touch a layout only oneDNN reads.
        self.weight_packed: torch.Tensor | None = None
        # weight_gguf's blocks (Q4_1 or Q8_0: gguf_type) tiled for the AMX kernel
        # (kernels/cpu_amx_q4.py), or None; set by engine/models/gguf_blocks.py. It decodes to
        # weight_bf16 exactly. A buffer (not in the state dict) so the native layers find it
        # with the others.
        self.register_buffer("weight_tiles", None, persistent=False)

    def keep_bf16_copy(self, keep: bool) -> None:
        """Make (or drop) the bf16 copy of the current weight, and its prepacked twin where
        oneDNN packs bf16 here; call after loading."""
        self.weight_bf16 = self.weight.detach().to(torch.bfloat16) if keep else None
        self.weight_packed = pack_for_onednn(self.weight_bf16) if keep else None

    def forward(self, x: torch.Tensor, bf16: bool = False) -> torch.Tensor:
        """x: [T, in] -> [T, out]. bf16=False, or no bf16 copy: on the weight as it is, in
        x.dtype. bf16=True: on the bf16 copy; bf16 out, or fp32 with a bias (see above)."""
        if not bf16 or self.weight_bf16 is None:
            return F.linear(x, self.weight, self.bias)
        out = self._bf16_product(x, torch.bfloat16)
        return out if self.bias is None else out + self.bias

    def float_forward(self, x: torch.Tensor, bf16: bool = False) -> torch.Tensor:
        """forward(x, bf16) as float32 (logits): on the tiles the kernel writes the bf16
        products widened, where .float() of forward's result would take a pass of its own."""
        if not bf16 or self.weight_bf16 is None:
            return self.forward(x, bf16).float()
        out = self._bf16_product(x, torch.float32)
        return out if self.bias is None else out + self.bias

    def _bf16_product(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """x @ the bf16 copy's transpose, rounded to bf16, as out_dtype (no bias)."""
        x = x.to(torch.bfloat16)
        tiles = self.weight_tiles  # (a buffer: one nn.Module lookup, not two)
        if tiles is not None and cpu_amx_q4.ENABLED and x.shape[0] <= cpu_amx_q4.MAX_ROWS:
            return cpu_amx_q4.matmul(x, tiles, self.out_features, self.gguf_type, out_dtype)
        if self.weight_packed is not None:
            out = torch.ops.mkldnn._linear_pointwise(x, self.weight_packed, None, "none", [], "")
        else:
            out = F.linear(x, self.weight_bf16)
        return out.to(out_dtype)


def pack_for_onednn(weight: torch.Tensor) -> torch.Tensor | None:
    """A bf16 [out, in] CPU weight in oneDNN's blocked layout, or None where this torch or
    CPU does not pack it (no mkldnn build, no native bf16, PACK_WEIGHTS off)."""
    if not (PACK_WEIGHTS and weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()):
        return None
    try:  # private ops (torch.compile's CPU freezing uses them): a build may lack them
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return None
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_HINT_ROWS)
    except (AttributeError, RuntimeError):
        return None


def fuse_parts_on_load(module: nn.Module, fused: str, parts: Sequence[str],
                       sizes: Sequence[int]) -> None:
    """Let `module` load `<part>.weight` / `<part>.bias` of each of `parts` (transformers'
    names, each with `sizes[i]` output rows) into `<fused>` and give them back from
    state_dict(). A state dict holding only some of the parts is left as it is, so
    load_state_dict reports the missing and unexpected names."""

    def fuse(_module, state_dict, prefix, *_args) -> None:
        for kind in ("weight", "bias"):
            names = [f"{prefix}{part}.{kind}" for part in parts]
            if all(name in state_dict for name in names):
                state_dict[f"{prefix}{fused}.{kind}"] = torch.cat(
                    [state_dict.pop(name) for name in names], dim=0)

    def split(_module, state_dict, prefix, _local_metadata) -> None:
        for kind in ("weight", "bias"):
            tensor = state_dict.pop(f"{prefix}{fused}.{kind}", None)
            if tensor is not None:  # views of the fused rows: no copy
                for part, piece in zip(parts, tensor.split(list(sizes), dim=0), strict=True):
                    state_dict[f"{prefix}{part}.{kind}"] = piece

    module.register_load_state_dict_pre_hook(fuse)
    module.register_state_dict_post_hook(split)
