"""Compile the Triton kernels for a GPU architecture on any machine, GPU or not.

The interpreter (TRITON_INTERPRET=1) checks what the kernels compute, not that Triton's
compiler accepts them or how they use the hardware. This script runs the real host wrappers
on meta tensors shaped like real models, captures each launch instead of running it,
specialises the arguments exactly as Triton's JIT would, compiles to cubin for the target
(sm_90 = H100/H200 by default) with the ptxas bundled in the triton wheel, and prints per
variant: registers, spill stack, shared memory and the load / matmul instructions used.

    python -m bench.kernel_compile                   # every model shape, bf16 and fp16, sm_90
    python -m bench.kernel_compile --quick --strict  # the test suite's subset; exit 1 on a
                                                     # 16-bit spill or shared memory overflow
    python -m bench.kernel_compile --smoke           # the tiny test shape only (seconds)

No GPU needed, nor the interpreter: it runs Triton's real compiler, so TRITON_INTERPRET is
cleared for this process even in --smoke.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not interpreted ones

import torch  # noqa: E402  (after the environment: triton reads it at import)
import triton  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import triton_decode, triton_kv_write, triton_prefill  # noqa: E402

# (num_heads, num_kv_heads, head_dim) of the models we serve or benchmark
SHAPES = {"smollm2-135m": (9, 3, 64), "llama-1b": (32, 8, 64), "bench-gqa": (32, 8, 128),
          "tiny-test": (4, 2, 16)}
SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}  # bytes per block (opt-in max)
KERNELS = {"_kv_write_kernel": triton_kv_write, "_decode_kernel": triton_decode,
           "_reduce_splits_kernel": triton_decode, "_prefill_kernel": triton_prefill}
INSTRUCTIONS = ("cp.async.cg", "ld.global.v4", "wgmma.mma_async", "mma.sync")


class _Capture:
    """Stands in for a JITFunction: `kernel[grid](*args, **kw)` records the launch."""

    def __init__(self, fn, launches: list) -> None:
        self.fn, self.launches = fn, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.fn, args, kwargs))


def capture(call) -> list:
    """Run `call()` with every kernel replaced by a _Capture; returns (fn, args, kwargs)."""
    launches: list = []
    patches = [mock.patch.object(mod, name, _Capture(getattr(mod, name), launches))
               for name, mod in KERNELS.items()]
    for p in patches:
        p.start()
    try:
        call()
    finally:
        for p in reversed(patches):
            p.stop()
    return launches


def compile_launch(fn, args, kwargs, arch: int):
    """Specialise like the JIT (ints == 1 and constexprs folded, 16-divisible ints and
    pointers marked) and compile for sm_`arch`. Returns the CompiledKernel."""
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    values = list(args) + [kwargs[p.name] for p in fn.params[len(args):]]
    signature, constexprs, attrs = {}, {}, {}
    for i, (param, value) in enumerate(zip(fn.params, values, strict=True)):
        if param.is_constexpr:
            kind, spec = "constexpr", value
        else:
            kind, spec = native_specialize_impl(CUDABackend, value, False, True, True)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[param.name] = spec
        elif spec:
            attrs[(i,)] = CUDABackend.parse_attr(spec)
    source = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def resources(kernel) -> dict:
    """Registers and spill stack (cuobjdump on the cubin), shared memory, instruction counts."""
    info = {"smem": kernel.metadata.shared, "regs": None, "stack": None}
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if tool.exists():
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            dump = subprocess.run([str(tool), "--dump-resource-usage", f.name],
                                  capture_output=True, text=True).stdout
        found = re.search(r"REG:(\d+) STACK:(\d+)", dump)
        if found:
            info["regs"], info["stack"] = int(found.group(1)), int(found.group(2))
    ptx = kernel.asm["ptx"]
    info["ops"] = {op: len(re.findall(re.escape(op), ptx)) for op in INSTRUCTIONS}
    return info


def meta_batch(shape, dtype, num_seqs: int, q_len: int, context_len: int, block_size: int = 16):
    """Meta tensors (no memory) of a batch: q, caches, tables, lengths, query_start_loc."""
    num_heads, num_kv_heads, head_dim = shape
    blocks = num_seqs * triton.cdiv(context_len, block_size)
    meta = {"device": "meta"}
    q = torch.empty(num_seqs * q_len, num_heads, head_dim, dtype=dtype, **meta)
    cache = torch.empty(blocks, block_size, num_kv_heads, head_dim, dtype=dtype, **meta)
    table = torch.empty(num_seqs, triton.cdiv(context_len, block_size) + 1, dtype=torch.int32,
                        **meta)
    lens = torch.empty(num_seqs, dtype=torch.int32, **meta)
    starts = torch.empty(num_seqs + 1, dtype=torch.int32, **meta)
    return q, cache, torch.empty_like(cache), table, lens, starts


def cases(quick: bool, smoke: bool = False):
    """(label, dtype, call) per variant: the launches of one engine step's kernels."""
    if smoke:  # two variants: decode and prefill at the tiny test shape, fp32
        return _cases_for("tiny-test", SHAPES["tiny-test"], torch.float32, True, quick)
    shapes = {"bench-gqa": SHAPES["bench-gqa"]} if quick else SHAPES
    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float16]
    out = []
    for name, shape in shapes.items():
        for dtype in [torch.float32] if name == "tiny-test" else dtypes:
            out += _cases_for(name, shape, dtype, name == "tiny-test", quick)
    if quick:
        out += _cases_for("tiny-test", SHAPES["tiny-test"], torch.float32, True, quick)
    return out


def _cases_for(name, shape, dtype, attention_only: bool, quick: bool):
    tag = f"{name} {str(dtype).removeprefix('torch.')}"
    decode = meta_batch(shape, dtype, num_seqs=64, q_len=1, context_len=4096)
    prefill = meta_batch(shape, dtype, num_seqs=2, q_len=2048, context_len=4096)
    q, k_cache, v_cache, *_ = decode
    kv = torch.empty(q.shape[0], shape[1], shape[2], dtype=dtype, device="meta")
    slots = torch.empty(q.shape[0], dtype=torch.int64, device="meta")
    scale = shape[2] ** -0.5
    out = [
        (f"{tag} decode", dtype, lambda: triton_decode.decode_attention(
            *decode[:5], scale, query_start_loc=decode[5], max_context_len=4096,
            num_splits=1)),
        (f"{tag} prefill 2048", dtype, lambda: triton_prefill.prefill_attention(
            *prefill, scale, 2048, skip_decodes=True)),
    ]
    if attention_only:
        return out
    tiles = [triton_decode.DecodeTile(*t) for t in ((64, 4, 3), (128, 4, 2), (128, 8, 2))]
    out += [(f"{tag} decode {tuple(t)}", dtype, lambda t=t: triton_decode.decode_attention(
        *decode[:5], scale, query_start_loc=decode[5], max_context_len=4096, num_splits=1,
        tile=t)) for t in (tiles if shape == SHAPES["bench-gqa"] and not quick else [])]
    return out + [
        (f"{tag} decode split-K", dtype, lambda: triton_decode.decode_attention(
            *decode[:5], scale, query_start_loc=decode[5], max_context_len=4096,
            num_splits=8)),
        (f"{tag} prefill 3", dtype, lambda: triton_prefill.prefill_attention(
            *prefill, scale, 3, skip_decodes=True)),
        (f"{tag} kv write", dtype, lambda: triton_kv_write.write_kv(
            k_cache, v_cache, kv, kv, slots)),
    ]


def compile_all(variants, arch: int) -> tuple[list[dict], list[str]]:
    """Compile each distinct launch of `variants` once; (rows, failures) with the resources
    of each (registers, spill bytes per thread, shared memory bytes, instruction counts)."""
    limit = SMEM_LIMIT.get(arch, 101376)
    seen, rows, failures = set(), [], []
    print(f"{'variant':34} {'kernel':22} {'regs':>4} {'spill':>5} {'smem':>7}  instructions")
    for label, dtype, call in variants:
        for fn, fargs, fkwargs in capture(call):
            key = (fn.__name__, repr(fargs), repr(sorted(fkwargs.items())))
            if key in seen:
                continue
            seen.add(key)
            info = resources(compile_launch(fn, fargs, fkwargs, arch))
            rows.append({"variant": label, "kernel": fn.__name__, **info})
            ops = " ".join(f"{op}:{n}" for op, n in info["ops"].items() if n)
            print(f"{label:34} {fn.__name__:22} {info['regs'] or '?':>4} "
                  f"{'?' if info['stack'] is None else info['stack']:>5} {info['smem']:>7}  {ops}")
            if info["smem"] > limit:
                failures.append(f"{label} {fn.__name__}: {info['smem']} B shared > {limit}")
            if dtype != torch.float32 and info["stack"]:
                failures.append(f"{label} {fn.__name__}: spills {info['stack']} B per thread")
    return rows, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    parser.add_argument("--quick", action="store_true", help="the test suite's subset")
    parser.add_argument("--smoke", action="store_true", help="the tiny test shape only")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 if a 16-bit variant spills or any exceeds shared memory")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    rows, failures = compile_all(cases(args.quick, args.smoke), args.arch)
    for failure in failures:
        print("FAIL", failure)
    result = {"bench": "kernel_compile", "arch": args.arch, "triton": triton.__version__,
              "variants": rows, "failures": failures}
    print(json.dumps({k: v for k, v in result.items() if k != "variants"}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 1 if failures and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
