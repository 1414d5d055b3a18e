"""Settle MKL VML's kernel choice for the float32 math the engine runs, once per process.

torch computes contiguous float32 exp, sin, cos, tanh, log, ... on CPU with MKL's vector
math library (VML): one call per intra-op thread's chunk, from 2048 elements. oneMKL
2024.2 (what torch's wheels bundle) picks a VML function's kernel on that function's first
call, and when the first call runs on two threads at once one thread can run a
low-accuracy kernel over its whole chunk (up to ~1.5e-4 relative where float32 promises
1 ulp): pytorch/pytorch#188792, gone from oneMKL 2025.0. Here it left the first torch-path
decode of ~1 process in 4-8 up to 5e-5 off (the softmax's exp), and could do the same to
the first large prefill's rotary tables (cos, sin). One single-threaded call of each
function (a one-element tensor never splits across threads) settles the choice before any
step runs: kernels/backends.py calls settle_vml_dispatch() at import (importing `kernels`
does).
"""

from __future__ import annotations

import torch

# The VML-backed unary ops the engine's float32 paths use (softmax, RoPE tables, SiLU and
# sampling), and a few neighbours that cost nothing to settle.
VML_FUNCTIONS = ("exp", "log", "sin", "cos", "tanh", "sqrt", "rsqrt", "log1p", "expm1",
                 "sigmoid", "erf")


def settle_vml_dispatch() -> None:
    """Run each of VML_FUNCTIONS once on one float32 element (one thread)."""
    one = torch.ones(1, dtype=torch.float32, device="cpu")
    for name in VML_FUNCTIONS:
        getattr(torch, name)(one)
