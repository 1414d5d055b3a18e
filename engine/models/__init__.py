"""Model definitions that run on the paged KV cache, and their loader.

    loaded = load_model("smollm2-135m")              # or a checkpoint dir / .gguf path
    caches = allocate_kv_caches(loaded.model.num_layers, num_blocks, block_size,
                                loaded.model.num_kv_heads, loaded.model.head_dim, dtype)
    positions, meta = build_attention_metadata(block_tables, context_lens, query_lens,
                                               block_size)
    hidden = loaded.model(input_ids, positions, caches, meta)       # [T, hidden]
    logits = loaded.model.compute_logits(hidden[last_token_rows])   # float32 [R, vocab]
"""

from __future__ import annotations

from engine.models.attention import (
    Attention,
    AttentionMetadata,
    KVCache,
    allocate_kv_caches,
    build_attention_metadata,
)
from engine.models.llama import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
from engine.models.loader import LoadedModel, build_model, load_model, save_checkpoint
from engine.models.registry import (
    MODEL_REGISTRY,
    architecture_of,
    get_model_class,
    supported_architectures,
)
from engine.models.rope import SUPPORTED_ROPE_TYPES
from engine.models.sources import MODEL_ALIASES, resolve_model_source

__all__ = [
    "MODEL_ALIASES",
    "MODEL_REGISTRY",
    "SUPPORTED_ROPE_TYPES",
    "Attention",
    "AttentionMetadata",
    "KVCache",
    "LlamaForCausalLM",
    "LoadedModel",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "allocate_kv_caches",
    "architecture_of",
    "build_attention_metadata",
    "build_model",
    "get_model_class",
    "load_model",
    "resolve_model_source",
    "save_checkpoint",
    "supported_architectures",
]
