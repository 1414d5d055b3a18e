"""Model classes by Hugging Face architecture name (config.architectures[0])."""

from __future__ import annotations

from typing import Any

from engine.models.llama import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM

MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
}

# Configs read from a GGUF file carry model_type but no `architectures`.
_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def get_model_class(arch: str) -> type[LlamaForCausalLM]:
    """The model class for an HF architecture name; ValueError naming the supported ones."""
    try:
        return MODEL_REGISTRY[arch]
    except KeyError:
        raise ValueError(
            f"architecture {arch!r} is not supported; supported architectures: "
            f"{', '.join(supported_architectures())}"
        ) from None


def architecture_of(config: Any) -> str:
    """config.architectures[0], else derived from config.model_type (GGUF configs)."""
    archs = getattr(config, "architectures", None) or []
    if archs:
        return archs[0]
    model_type = getattr(config, "model_type", None)
    if model_type in _ARCH_BY_MODEL_TYPE:
        return _ARCH_BY_MODEL_TYPE[model_type]
    raise ValueError(
        f"config has no `architectures` and model_type={model_type!r} is not one of "
        f"{sorted(_ARCH_BY_MODEL_TYPE)}; supported architectures: "
        f"{', '.join(supported_architectures())}"
    )
