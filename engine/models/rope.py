"""Rotary position embeddings with the config's scaling, matching transformers bit for bit.

transformers 5 keeps RoPE settings in `config.rope_parameters` ({"rope_type", "rope_theta",
"factor", ...}); older configs carry `config.rope_theta` plus an optional `config.rope_scaling`
dict whose type key is "type" or "rope_type". `rope_settings` reads either form.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DEFAULT_ROPE_THETA = 10000.0


def rope_settings(config: Any) -> dict[str, Any]:
    """The config's RoPE parameters as one flat dict with "rope_type" and "rope_theta" set."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = dict(params or {})
    if "rope_type" not in params:
        params["rope_type"] = params.pop("type", "default")
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(config, "rope_theta", None) or DEFAULT_ROPE_THETA
    return params


def rope_inv_freq(config: Any, head_dim: int) -> torch.Tensor:
    """Inverse frequencies float32 [head_dim // 2] on CPU for the config's rope type.

    Raises ValueError for rope types this engine does not implement.
    """
    params = rope_settings(config)
    rope_type = params["rope_type"]
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type={rope_type!r} is not supported; supported rope types: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor={partial} is not supported (only 1.0)")
    base = float(params["rope_theta"])
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (base**exponents)  # [head_dim // 2], radians per position
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, params, config)
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict, config: Any) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp
    between (the same arithmetic as transformers' _compute_llama3_parameters)."""
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context_len = params.get("original_max_position_embeddings")
    old_context_len = old_context_len or config.max_position_embeddings
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq  # positions per turn
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [..., d] with halves (x1, x2) mapped to (-x2, x1) (the HF layout)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for a flat batch of absolute positions.

    No buffers: inv_freq lives on CPU and is copied to each device once, so the module works
    unchanged after a model is built on the meta device and materialised elsewhere.
    """

    def __init__(self, config: Any, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self._inv_freq_cpu = rope_inv_freq(config, head_dim)  # float32 [d // 2]
        self._inv_freq_by_device: dict[torch.device, torch.Tensor] = {}

    def _inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq_by_device:
            self._inv_freq_by_device[device] = self._inv_freq_cpu.to(device)
        return self._inv_freq_by_device[device]

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: int [T] -> (cos, sin), each [T, head_dim] in `dtype`.

        Computed in float32 and then cast, as transformers does, so bf16 runs round alike.
        """
        freqs = positions[:, None].float() * self._inv_freq(positions.device)  # [T, d // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, d]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """x: [T, heads, d]; cos, sin: [T, d] -> rotated x, same shape and dtype."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]
