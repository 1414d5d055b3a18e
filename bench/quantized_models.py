"""A model's projections rounded to GGUF blocks and written as a GGUF file of tensors, for
the smoke runs and tests of the GGUF-block path (engine/models/gguf_blocks.py) on tiny
random models: the bundled SmolLM2 GGUF is the only real one here, and transformers needs
a tokenizer inside a GGUF to load it, which a tiny random checkpoint does not have.

`quantize_to_gguf` rounds each decoder projection (and lm_head, or the tied embedding) to
the blocks of a GGUF type with gguf-py, writes the decoded weights back into the float32
model (so the model is exactly what the file holds, as after a GGUF load) and writes the
blocks under llama.cpp's tensor names, q and k rows in llama.cpp's rotary order. The file
has tensors only: attach_gguf_blocks reads nothing else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

_PARTS = (("self_attn.qkv_proj", ("attn_q", "attn_k", "attn_v")),
          ("self_attn.o_proj", ("attn_output",)),
          ("mlp.gate_up_proj", ("ffn_gate", "ffn_up")),
          ("mlp.down_proj", ("ffn_down",)))


def quantize_to_gguf(model, path: str | Path, layer_type: str = "Q4_1",
                     head_type: str | None = "Q8_0") -> Path:
    """Round `model` (our Llama, float32, in place) to GGUF blocks and write them to
    `path`; head_type None leaves lm_head float32 and out of the file. Dimensions must be
    multiples of 32. Drops any bf16 copies (call keep_bf16_copies again to remake them)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    config = model.config
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for i, layer in enumerate(model.model.layers):
        for attr, parts in _PARTS:
            proj = layer.get_submodule(attr)
            sizes = _part_sizes(model, parts)
            pieces = proj.weight.detach().split(sizes, dim=0)
            decoded = []
            for part, piece in zip(parts, pieces, strict=True):
                blocks, weights = _round(piece.numpy(), getattr(GGMLQuantizationType, layer_type))
                if part in heads:
                    blocks = _permute_heads(blocks, heads[part])
                writer.add_tensor(f"blk.{i}.{part}.weight", blocks,
                                  raw_dtype=getattr(GGMLQuantizationType, layer_type))
                decoded.append(torch.from_numpy(weights))
            with torch.no_grad():
                proj.weight.copy_(torch.cat(decoded))
    if head_type is not None:
        name = ("token_embd.weight" if getattr(config, "tie_word_embeddings", False)
                else "output.weight")
        qtype = getattr(GGMLQuantizationType, head_type)
        blocks, weights = _round(model.lm_head.weight.detach().numpy(), qtype)
        writer.add_tensor(name, blocks, raw_dtype=qtype)
        with torch.no_grad():
            model.lm_head.weight.copy_(torch.from_numpy(weights))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model.keep_bf16_copies(None)
    return Path(path)


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


def _permute_heads(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """transformers' q / k row order -> llama.cpp's (each head's rotary halves interleaved),
    the inverse of gguf_blocks._unpermute_heads."""
    half = rows.shape[0] // num_heads // 2
    return rows.reshape(num_heads, 2, half, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
