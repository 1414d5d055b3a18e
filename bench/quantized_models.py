"""A model's projections rounded to GGUF blocks and written as a GGUF file of tensors, for
the smoke runs and tests of the GGUF-block path (engine/models/gguf_blocks.py) on tiny
random models: the bundled SmolLM2 GGUF is the only real one here, and transformers needs
a tokenizer inside a GGUF to load it, which a tiny random checkpoint does not have.

`quantize_to_gguf` rounds each decoder projection (and lm_head, or the tied embedding) to
the blocks of a GGUF type with gguf-py, writes the decoded weights back into the float32
model (so the model is exactly what the file holds, as after a GGUF load) and writes the
blocks under llama.cpp's tensor names, q and k rows in llama.cpp's rotary order. The file
has tensors only: attach_gguf_blocks reads nothing else. `as_if_from_gguf` does both steps
for a benchmark's smoke model; `blocks_set_aside` lets a benchmark side run without them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from engine.models.gguf_blocks import (
    PROJECTION_PARTS,
    attach_gguf_blocks,
    rotary_heads,
    rotary_order,
)


def quantize_to_gguf(model, path: str | Path, layer_type: str = "Q4_1",
                     head_type: str | None = "Q8_0",
                     tensor_types: dict[str, str] | None = None) -> Path:
    """Round `model` (our Llama, float32, in place) to GGUF blocks and write them to
    `path`; head_type None leaves lm_head float32 and out of the file. `tensor_types`
    gives some tensors another type than layer_type, by name without ".weight"
    ("blk.1.attn_v"), as llama.cpp's per-tensor overrides do. Dimensions must be
    multiples of 32. Drops any bf16 copies (call keep_bf16_copies again to remake them)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    config, rotary = model.config, rotary_heads(model.config)
    tensor_types = tensor_types or {}
    for i, layer in enumerate(model.model.layers):
        for attr, parts in PROJECTION_PARTS:
            proj = layer.get_submodule(attr)
            pieces = proj.weight.detach().split(_part_sizes(model, parts), dim=0)
            decoded = []
            for part, piece in zip(parts, pieces, strict=True):
                name = f"blk.{i}.{part}"
                qtype = getattr(GGMLQuantizationType, tensor_types.get(name, layer_type))
                blocks, weights = _round(piece.numpy(), qtype)
                writer.add_tensor(f"{name}.weight",
                                  rotary_order(blocks, rotary.get(part), to_gguf=True),
                                  raw_dtype=qtype)
                decoded.append(torch.from_numpy(weights))
            with torch.no_grad():
                proj.weight.copy_(torch.cat(decoded))
    if head_type is not None:
        name = ("token_embd.weight" if getattr(config, "tie_word_embeddings", False)
                else "output.weight")
        head_qtype = getattr(GGMLQuantizationType, head_type)
        blocks, weights = _round(model.lm_head.weight.detach().numpy(), head_qtype)
        writer.add_tensor(name, blocks, raw_dtype=head_qtype)
        with torch.no_grad():
            model.lm_head.weight.copy_(torch.from_numpy(weights))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model.keep_bf16_copies(None)
    return Path(path)


def as_if_from_gguf(model) -> None:
    """A benchmark's smoke model as if loaded from a GGUF under dtype auto: rounded to Q4_1
    layers and a Q8_0 head, bf16 copies remade, the blocks attached."""
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        path = quantize_to_gguf(model, Path(tmp) / "blocks.gguf")
        model.keep_bf16_copies(1)
        attach_gguf_blocks(model, path)


@contextmanager
def blocks_set_aside(model, aside: bool = True) -> Iterator[None]:
    """With `aside`, the model runs as if it had no GGUF blocks (the native layers on its
    other weights), until the block ends; it keeps them."""
    kept = model.gguf_layers_type, model.lm_head.weight_gguf
    if aside:
        model.gguf_layers_type = model.lm_head.weight_gguf = None
    try:
        yield
    finally:
        model.gguf_layers_type, model.lm_head.weight_gguf = kept


def _part_sizes(model, parts: tuple[str, ...]) -> list[int]:
    attn, config = model.model.layers[0].self_attn, model.config
    size = {"attn_q": attn.num_heads * attn.head_dim, "attn_k": attn.num_kv_heads * attn.head_dim,
            "attn_v": attn.num_kv_heads * attn.head_dim, "attn_output": config.hidden_size,
            "ffn_gate": config.intermediate_size, "ffn_up": config.intermediate_size,
            "ffn_down": config.hidden_size}
    return [size[part] for part in parts]


def _round(weights: np.ndarray, qtype) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 blocks [rows, row_bytes], the float32 weights they decode to)."""
    from gguf import quants

    blocks = quants.quantize(np.ascontiguousarray(weights, dtype=np.float32), qtype)
    return blocks, quants.dequantize(blocks, qtype).astype(np.float32)
