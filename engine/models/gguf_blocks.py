"""A GGUF model's own weight blocks, kept next to its float32 weights for small decode steps.

A GGUF file stores SmolLM2-135M's projections as Q4_1 blocks (4.5 bits a weight) and its
embedding / tied lm_head as Q8_0 (8.5 bits); the loader decodes them to float32. A decode
step of a few rows is bound by reading the weights, and the native decode layers
(kernels/cpu_quant_dot.c) read the blocks as they are: ~3.5x fewer bytes than the bf16
copies, and the weights they decode to are the float32 model's, bit for bit. So under
dtype auto each projection also keeps its blocks (`Projection.weight_gguf`), and
engine/models/native_decode.py runs small decode steps on them.

`attach_gguf_blocks` only attaches blocks that decode to exactly the loaded weights: it
decodes every one and compares it with the model's float32 weight (torch.equal). The GGUF
stores q and k rows in llama.cpp's rotary order, which transformers reverses on load; the
blocks are put in the same order (`rotary_order`) and the check proves it. Anything
else (another block type, a mix of types among the layers, a row that differs) keeps the
model as it was, with the reason logged.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import numpy as np
import torch

from engine.models.projections import Projection
from kernels import cpu_amx_q4, cpu_layers

log = logging.getLogger(__name__)

# Our fused projection -> the GGUF tensors of its parts, in its row order (projections.py).
PROJECTION_PARTS = (("self_attn.qkv_proj", ("attn_q", "attn_k", "attn_v")),
          ("self_attn.o_proj", ("attn_output",)),
          ("mlp.gate_up_proj", ("ffn_gate", "ffn_up")),
          ("mlp.down_proj", ("ffn_down",)))


def attach_gguf_blocks(model, gguf_path: str | Path) -> str | None:
    """Give the decoder projections (and lm_head) of a float32 CPU `model` loaded from
    `gguf_path` the blocks their weights were decoded from. Returns what was attached, in
    words for the ready line, or None (nothing attached, the reason logged)."""
    if not cpu_layers.available() or model.lm_head.weight.dtype != torch.float32:
        return None
    try:
        tensors = read_tensor_index(gguf_path)
    except (OSError, ValueError, struct.error) as exc:
        log.info("GGUF blocks not used: %s", exc)
        return None
    layers = _layer_blocks(model, tensors)
    if isinstance(layers, str):
        log.info("GGUF blocks not used for the decoder layers: %s", layers)
        return None
    gguf_type = layers[0][2]
    for proj, blocks, _ in layers:
        proj.weight_gguf, proj.gguf_type = blocks, gguf_type
    model.gguf_layers_type = gguf_type
    if gguf_type == "Q4_1" and _tile_for_amx(model, layers):  # the native layers read Q4_1 tiles
        below = cpu_layers.NATIVE_TILES_MIN_ROWS - 1
        described = (f"GGUF {gguf_type} blocks for decode steps of"
                     f" {'1 row' if below == 1 else f'1-{below} rows'}, on AMX for steps of"
                     f" <= {cpu_amx_q4.MAX_ROWS} rows (in the native layers"
                     f" {cpu_layers.NATIVE_TILES_MIN_ROWS}-{cpu_layers.NATIVE_TILES_MAX_ROWS})")
    else:
        described = (f"GGUF {gguf_type} blocks for decode steps of <="
                     f" {cpu_layers.NATIVE_GGUF_MAX_ROWS} rows")
    head = _head_blocks(model, tensors)
    if isinstance(head, str):
        log.info("GGUF blocks not used for lm_head: %s", head)
        return described
    model.lm_head.weight_gguf, model.lm_head.gguf_type = head
    on_amx = ", on AMX" if _tile_for_amx(model, [(model.lm_head, *head)]) else ""
    return f"{described} (lm_head {head[1]}{on_amx})"


def _tile_for_amx(model, projections: list[tuple[Projection, torch.Tensor, str]]) -> bool:
    """Tile the blocks (Q4_1, or Q8_0) for the AMX kernel (Projection.weight_tiles) where
    the model runs its steps on bf16 copies (which the tiles decode to) and AMX is granted
    here."""
    if not (projections[0][2] in cpu_amx_q4.TILE_BYTES and model.bf16_min_rows is not None
            and cpu_amx_q4.available()
            and all(cpu_amx_q4.packs(*proj.weight.shape) for proj, _, _ in projections)):
        return False
    for proj, blocks, gguf_type in projections:
        proj.weight_tiles = cpu_amx_q4.pack(blocks, proj.in_features, gguf_type)
    return True


def _layer_blocks(model, tensors: dict) -> list[tuple[Projection, torch.Tensor, str]] | str:
    """(projection, its blocks, block type) for every decoder projection, or why not."""
    found, rotary = [], rotary_heads(model.config)
    for i, layer in enumerate(model.model.layers):
        for attr, parts in PROJECTION_PARTS:
            names = [f"blk.{i}.{part}.weight" for part in parts]
            if any(name not in tensors for name in names):
                return f"the file has no {' / '.join(names)}"
            types = {tensors[name].gguf_type for name in names}
            if len(types) != 1 or not types <= cpu_layers.GGUF_FORMATS.keys():
                return (f"{names[0]} holds {sorted(types)}, not one of"
                        f" {sorted(cpu_layers.GGUF_FORMATS)}")
            gguf_type = types.pop()
            pieces = [rotary_order(tensors[name].rows(), rotary.get(part), to_gguf=False)
                      for part, name in zip(parts, names, strict=True)]
            proj = layer.get_submodule(attr)
            blocks = torch.from_numpy(np.ascontiguousarray(np.concatenate(pieces)))
            reason = _mismatch(proj, blocks, gguf_type)
            if reason:
                return f"{names[0]}: {reason}"
            found.append((proj, blocks, gguf_type))
    if len({gguf_type for *_, gguf_type in found}) != 1:
        return "the layers mix block types"
    return found


def _head_blocks(model, tensors: dict) -> tuple[torch.Tensor, str] | str:
    """lm_head's blocks (output.weight, else the tied token_embd.weight), or why not."""
    name = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    if name == "token_embd.weight" and not getattr(model.config, "tie_word_embeddings", False):
        return "the file has no output.weight"
    gguf_type = tensors[name].gguf_type
    if gguf_type not in cpu_layers.GGUF_FORMATS:
        return f"{name} holds {gguf_type}"
    blocks = torch.from_numpy(np.array(tensors[name].rows()))
    reason = _mismatch(model.lm_head, blocks, gguf_type)
    return f"{name}: {reason}" if reason else (blocks, gguf_type)


def _mismatch(proj: Projection, blocks: torch.Tensor, gguf_type: str) -> str | None:
    """None when `blocks` decode to exactly proj's float32 weight, else what differs."""
    out_features, in_features = proj.weight.shape
    if blocks.shape[0] != out_features:
        return f"{blocks.shape[0]} rows for a weight of {out_features}"
    try:
        decoded = cpu_layers.dequantize_rows(blocks, gguf_type, in_features)
    except ValueError as exc:
        return str(exc)
    if not torch.equal(decoded, proj.weight):
        return "the blocks do not decode to the loaded weights"
    return None


def rotary_heads(config) -> dict[str, int]:
    """The GGUF parts whose rows llama.cpp stores in its rotary order, with their heads."""
    return {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}


def rotary_order(rows: np.ndarray, num_heads: int | None, to_gguf: bool) -> np.ndarray:
    """q / k rows [heads * d, ...] between transformers' order (each head's two rotary
    halves one after the other) and llama.cpp's (the halves interleaved), either way;
    num_heads None: rows of another part, returned as they are."""
    if num_heads is None:
        return rows
    half = rows.shape[0] // num_heads // 2
    split = (num_heads, 2, half) if to_gguf else (num_heads, half, 2)
    return rows.reshape(*split, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


class GGUFTensor:
    """One tensor of a GGUF file: its block type's name, its rows of blocks on request."""

    def __init__(self, path: Path, gguf_type: str, dims: tuple[int, ...], offset: int) -> None:
        self.path, self.gguf_type, self.dims, self.offset = path, gguf_type, dims, offset

    def rows(self) -> np.ndarray:
        """uint8 [rows, row_bytes], memory-mapped (dims[0] is the row length in weights)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block_weights, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[self.gguf_type]]
        row_bytes = self.dims[0] // block_weights * block_bytes
        rows = int(np.prod(self.dims[1:], dtype=np.int64))
        return np.memmap(self.path, np.uint8, "r", self.offset, (rows, row_bytes))


# GGUF metadata value types -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
            11: "q", 12: "d"}


def read_tensor_index(path: str | Path) -> dict[str, GGUFTensor]:
    """The tensors of a little-endian GGUF (v2, v3) by name, the metadata skipped over.
    gguf-py's GGUFReader parses every metadata value into numpy views first, ~4 s for
    SmolLM2's 49,152-token vocabulary; this reads only what locating tensors needs."""
    from gguf import GGMLQuantizationType

    path = Path(path)
    data = np.memmap(path, np.uint8, "r")
    buf = memoryview(data)
    magic, version, num_tensors, num_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError(f"{path.name} is not a little-endian GGUF v2/v3 file")
    pos, alignment = 24, 32
    for _ in range(num_kv):
        key, pos = _string(buf, pos)
        (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        if key == "general.alignment" and kind == 4:
            alignment = struct.unpack_from("<I", buf, pos)[0]
        pos = _skip_value(buf, pos, kind)
    infos = []
    for _ in range(num_tensors):
        name, pos = _string(buf, pos)
        (num_dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        dims, pos = struct.unpack_from(f"<{num_dims}Q", buf, pos), pos + 8 * num_dims
        kind, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        infos.append((name, GGMLQuantizationType(kind).name, dims, offset))
    start = -(-pos // alignment) * alignment
    return {name: GGUFTensor(path, kind, dims, start + offset)
            for name, kind, dims, offset in infos}


def _string(buf: memoryview, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    return bytes(buf[pos + 8:pos + 8 + length]).decode("utf-8", "replace"), pos + 8 + length


def _skip_value(buf: memoryview, pos: int, kind: int) -> int:
    if kind in _SCALARS:
        return pos + struct.calcsize(_SCALARS[kind])
    if kind == 8:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if kind != 9:
        raise ValueError(f"unknown GGUF metadata type {kind}")
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item in _SCALARS:
        return pos + count * struct.calcsize(_SCALARS[item])
    for _ in range(count):
        pos = _skip_value(buf, pos, item)
    return pos
