"""Which dtype the weights run in: the `dtype` option ("auto" | "float32" | "bfloat16").

    float32   fp32 weights, activations and KV cache (what the parity tests use)
    bfloat16  bf16 weights, activations and KV cache (the default on CUDA)
    auto      CUDA: bfloat16. CPU with AMX or AVX-512-BF16: fp32 weights plus a bf16 copy
              of every projection; with the native decode layers (kernels/cpu_layers.c,
              wherever a C compiler builds them) every step runs its projections on the
              copies, else steps of BF16_MIN_ROWS tokens or more (logits: rows) do; the
              activations, norms, RoPE, attention and KV cache stay fp32. Other CPUs:
              float32.

Measured on 2 vCPUs of a Xeon with AMX (torch 2.13, 2 threads, SmolLM2-135M's 30 layers of
projections, distinct weights per layer so nothing stays in cache; medians of 9 A/B pairs):

    rows per step      1     2     3     4     8     16    32    64
    fp32 ms          16.5  17.6  18.9  28.6  34.4  42.0  49.5  74.5
    bf16 ms          18.5  18.5  18.9  18.9  19.7  19.4  21.9  27.0

fp32 streams weights faster below 3 rows (oneDNN's bf16 GEMV reads ~12 GB/s against fp32's
~26 GB/s); from 4 rows the fp32 GEMM path is slower and AMX wins 1.5-2.8x (lm_head alike:
equal at 1-3 rows, 2-2.8x from 4). So single-stream decode keeps fp32 and batched steps
take bf16, at the cost of holding both copies (2 bytes more per projection parameter).

NATIVE_POLICY. The table above is torch's (oneDNN's) projections. The native decode
layers multiply bf16 weights by fp32 activations in their own GEMV, which streams bf16 at
~15 GB/s against oneDNN's ~12 GB/s and fp32's ~23 GB/s, so half the bytes win at one row
too (bench/native_layers_ab.py, whole engine steps, SmolLM2-135M, 2 threads, quiet VM):

    decode rows          1     2     4     8    16
    native, fp32 ms    27.5  32.9  43.4  59.6  74.2
    native, bf16 ms    21.5  29.6  30.4  39.8  54.9
    best torch ms      41.5  45.5  49.4  52.6  62.3

So with the native layers every step takes the bf16 copies (BF16_MIN_ROWS_NATIVE), except
where a GGUF model keeps its own blocks (engine/models/gguf_blocks.py, attached by the
loader under auto): decode steps of up to NATIVE_GGUF_MAX_ROWS rows read those (the
float32 weights exactly, 4.5 bits a weight for Q4_1; kernels/cpu_layers.py has the table).

The activations between projections stay fp32 under auto (projections.py says where bf16
results are promoted back). The KV cache is the `kv_cache_dtype` option (kv_cache_dtype()
below): under auto it is bfloat16 where the native decode layers build, whose decode
attention reads bf16 rows in place and whose RoPE + KV writes round to bf16 (half the bytes
every decode reads: 64 decodes over ~150-token contexts, 30 layers, 25.1 -> 19.7 ms,
bench/cpu_attention_ab.py); elsewhere the model's dtype, because the torch path gathers
the context and converts it, which made decode attention 0.3-0.5x as fast at 64-128
sequences. Attention itself computes in fp32 either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config.dtype_option import DTYPE_CHOICES, parse_dtype_choice
from kernels import cpu_layers

__all__ = ["BF16_MIN_ROWS", "DTYPE_CHOICES", "DtypePlan", "parse_dtype", "resolve_dtype"]
BF16_MIN_ROWS = 4  # measured crossover of the torch layers, see the table above
# With the native decode layers (kernels/cpu_layers.c), whose bf16 GEMV streams bf16 weights
# at full bandwidth, every step runs on the bf16 copies: see NATIVE_POLICY above.
BF16_MIN_ROWS_NATIVE = 1
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 matmuls
_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class DtypePlan:
    """What a dtype choice resolved to on one device.

    dtype: weights as loaded, activations and KV cache; bf16_min_rows: steps of at least
    this many tokens run their projections on bf16 copies (None: no copies); reason: why,
    in words for the ready line and logs."""

    choice: str
    dtype: torch.dtype
    bf16_min_rows: int | None
    reason: str

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        if self.bf16_min_rows is None:
            return f"{name} ({self.reason})"
        if self.bf16_min_rows == 1:
            return f"{name}, bf16 projections for every step ({self.reason})"
        return (f"{name}, bf16 projections for steps of >= {self.bf16_min_rows} tokens "
                f"({self.reason})")


def parse_dtype(value: str | torch.dtype | None) -> str | torch.dtype:
    """A dtype choice from a string or None ("auto"); a floating torch.dtype is kept as
    an explicit choice (float16 too). ValueError otherwise."""
    if isinstance(value, torch.dtype):
        if not value.is_floating_point:
            raise ValueError(f"dtype={value} must be a floating dtype or one of "
                             f"{', '.join(DTYPE_CHOICES)}")
        return value
    return parse_dtype_choice(value)


def cpu_bf16_flags() -> tuple[str, ...]:
    """The BF16_CPU_FLAGS this CPU reports in /proc/cpuinfo (none where it cannot be read:
    no native bf16 assumed, so auto stays fp32)."""
    flags = cpu_info()[1]
    return tuple(flag for flag in BF16_CPU_FLAGS if flag in flags)


def cpu_info() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; ("", no flags) where it
    cannot be read (not Linux)."""
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return "", frozenset()
    name, flags = "", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and flags is None:
            flags = frozenset(value.split())
        if name and flags is not None:
            break
    return name, flags or frozenset()


def resolve_dtype(value: str | torch.dtype | None, device: torch.device | str) -> DtypePlan:
    """The plan for a dtype choice on `device` (see the module docstring)."""
    choice = parse_dtype(value)
    device = torch.device(device)
    if isinstance(choice, torch.dtype) or choice != "auto":
        dtype = choice if isinstance(choice, torch.dtype) else getattr(torch, choice)
        name = str(dtype).removeprefix("torch.")
        return DtypePlan(name, dtype, None, f"asked for {name}")
    if device.type != "cpu":
        return DtypePlan(choice, torch.bfloat16, None, f"auto on {device.type}")
    flags = cpu_bf16_flags()
    if not flags:
        return DtypePlan(choice, torch.float32, None,
                         "auto: this CPU has no amx_bf16 or avx512_bf16")
    reason = f"auto: CPU has {'+'.join(flags)}, torch {torch.backends.cpu.get_cpu_capability()}"
    if cpu_layers.available():
        return DtypePlan(choice, torch.float32, BF16_MIN_ROWS_NATIVE,
                         f"{reason}, native decode layers")
    return DtypePlan(choice, torch.float32, BF16_MIN_ROWS, reason)


def kv_cache_dtype(choice: str, model_dtype: torch.dtype, plan: DtypePlan | None) -> torch.dtype:
    """The KV cache's element type for the kv_cache_dtype option ("auto", "float32",
    "bfloat16"): auto is bfloat16 where the weights run bf16 copies with the native decode
    layers (their kernels read and write a bf16 cache in place), else the model's dtype
    (float32 models, the parity tests' choice, keep a float32 cache)."""
    if choice != "auto":
        return getattr(torch, parse_dtype_choice(choice))
    native_bf16 = plan is not None and plan.bf16_min_rows == BF16_MIN_ROWS_NATIVE
    return torch.bfloat16 if native_bf16 and model_dtype == torch.float32 else model_dtype
