"""CPU attention A/B: the `cpu` backend's decode paths side by side, alternating in one process.

Sides (each a (write_kv, paged_attention) pair given to every attention layer):

    before   kernels/cpu_attention.py as committed at --against (default HEAD) with the
             reference write_kv: the baseline, loaded from git without touching the tree
    torch    this tree with NATIVE_DECODE off: the torch decode path (gather + bmm, or
             per-decode SDPA up to FEW_DECODES), host work once per step (kernels/cpu_plan.py)
    native   this tree as served: decodes in the native kernel (kernels/native_library.py)

Part 1 (kernel): write_kv + paged_attention over SmolLM2-shaped layers (9 heads, 3 KV heads,
d 64, block 16; 30 layers, each its own cache, so nothing stays hot between layers), per
step shape: decodes at --context tokens, batch 1/16/64, and a mixed step (one 256-token
prefill chunk + 16 decodes). `native_bf16` runs the native side on bf16 caches (half the
bytes read; only meaningful where the engine keeps a bf16 cache), with decodes over more
than 16 keys on AMX where the CPU has it (kernels/cpu_decode_amx.h);
`native_bf16_f32dot` the same with float32 products (native_library.AMX_DECODE off).
Part 2 (engine, unless --kernel-only): ModelRunner.execute of real decode steps on the
model (SmolLM2-135M, dtype auto), the sides alternating per step batch.

Every figure is ms per step: median [min-max] over --pairs samples, sides alternating
A B C A B C ...; ratios are of medians. The last stdout line is one JSON object.

    python -m bench.cpu_attention_ab [--pairs 7] [--threads 2] [--kernel-only]
    python -m bench.cpu_attention_ab --smoke     # tiny sizes, seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from kernels import AttentionBackend, cpu_attention, native_library, reference
from kernels.cpu_plan import write_kv as plan_write_kv

ROOT = Path(__file__).resolve().parents[1]
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# What a revision before issue 30 calls by the names it had then (kernels/cpu_native.py,
# cpu_plan.step_plan): the committed file runs against this tree's kernels.
RENAMED = {"cpu_native": "native_library", "step_plan": "attention_plan"}


def committed_module(rev: str):
    """kernels/cpu_attention.py at git revision `rev`, imported under another name."""
    source = subprocess.run(["git", "show", f"{rev}:kernels/cpu_attention.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    for old, new in RENAMED.items():
        source = re.sub(rf"\b{old}\b", new, source)
    spec = importlib.util.spec_from_loader(f"kernels._cpu_attention_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{rev}:kernels/cpu_attention.py", "exec"), module.__dict__)  # noqa: S102
    return module


def sides(rev: str) -> dict[str, tuple[AttentionBackend, bool]]:
    """name -> (backend, NATIVE_DECODE while it runs)."""
    before = committed_module(rev)
    current = AttentionBackend("cpu", plan_write_kv, cpu_attention.paged_attention)
    out = {"before": (AttentionBackend("before", reference.write_kv, before.paged_attention),
                      False),
           "torch": (current, False)}
    if native_library.load() is not None:
        out["native"] = (current, True)
    else:
        log(f"native side skipped: {native_library.unavailable_reason()}")
    return out


def make_step(layers: int, decodes: int, context: int, prefill: int, dtype: torch.dtype):
    """Caches for `layers` layers and one step's metadata: `decodes` decodes at `context`
    tokens, then one prefill chunk of `prefill` new tokens (0: none), blocks shuffled."""
    from engine.models.attention import build_attention_metadata

    gen = torch.Generator().manual_seed(0)
    lens = [(context, 1)] * decodes + ([(prefill, prefill)] if prefill else [])
    owned = [-(-ctx // BLOCK) for ctx, _ in lens]
    perm = torch.randperm(sum(owned) + 1, generator=gen).tolist()
    tables, at = [], 0
    for count in owned:
        tables.append(perm[at:at + count])
        at += count
    shape = (len(perm), BLOCK, KV_HEADS, HEAD_DIM)
    caches = [(torch.randn(shape, generator=gen).to(dtype),
               torch.randn(shape, generator=gen).to(dtype)) for _ in range(layers)]
    _, meta = build_attention_metadata(tables, [c for c, _ in lens], [q for _, q in lens], BLOCK)
    tokens = meta.num_tokens
    qkv = torch.randn(tokens, HEADS + 2 * KV_HEADS, HEAD_DIM, generator=gen)
    return caches, meta, qkv  # q, k, v: strided views of qkv, as in the model


def run_layers(backend: AttentionBackend, caches, meta, qkv) -> None:
    q, k, v = qkv[:, :HEADS], qkv[:, HEADS:HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS:]
    for k_cache, v_cache in caches:
        backend.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        backend.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens,
                                meta.query_start_loc, HEAD_DIM**-0.5)


def alternate(fns: dict[str, object], pairs: int) -> dict[str, dict]:
    """ms per call of each fn, A B C A B C ... (after one untimed call each)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(pairs):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - started) * 1e3)
    return {name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for name, v in samples.items()}


def with_switch(module, name: str, value: bool, fn):
    """fn run with module.name set to value, and back to True (as served) after."""
    def call():
        setattr(module, name, value)
        try:
            fn()
        finally:
            setattr(module, name, True)
    return call


def with_native(flag: bool, fn):
    return with_switch(cpu_attention, "NATIVE_DECODE", flag, fn)


def kernel_part(args, chosen) -> dict:
    shapes = {f"decode x{b}": (b, 0) for b in args.batches} | {"mixed 256+16": (16, 256)}
    if args.smoke:
        shapes = {"decode x4": (4, 0), "mixed 16+2": (2, 16)}
    results = {}
    for name, (decodes, prefill) in shapes.items():
        step = make_step(args.layers, decodes, args.context, prefill, torch.float32)
        fns = {side: with_native(flag, lambda b=backend, st=step: run_layers(b, *st))
               for side, (backend, flag) in chosen.items()}
        if "native" in chosen:
            bf16 = make_step(args.layers, decodes, args.context, prefill, torch.bfloat16)
            fns["native_bf16"] = lambda st=bf16: run_layers(chosen["native"][0], *st)
            fns["native_bf16_f32dot"] = with_switch(
                native_library, "AMX_DECODE", False,
                lambda st=bf16: run_layers(chosen["native"][0], *st))
        results[name] = alternate(fns, args.pairs)
        log(f"  kernel {name:>14}: " + "  ".join(
            f"{s} {r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]"
            for s, r in results[name].items()))
    return results


def engine_part(args, chosen) -> dict:
    from bench import roofline_steps as steps
    from engine.execution.model_runner import ModelRunner
    from engine.models import load_model

    loaded = load_model(args.model, dtype="auto")
    blocks = steps.blocks_needed(max(args.batches), args.context, 0, BLOCK)
    runner = ModelRunner(loaded, blocks, BLOCK)
    attn_layers = [m for m in runner.model.modules()
                   if isinstance(getattr(m, "backend", None), AttentionBackend)]
    results = {}
    for batch in args.batches:
        out = steps.build_step(steps.StepShape(f"decode x{batch}", batch, args.context, 0),
                               runner.model.config.vocab_size, BLOCK, 0.0)

        def step(backend, flag, out=out):
            for layer in attn_layers:
                layer.backend = backend
            with_native(flag, lambda: runner.execute(out))()

        fns = {side: (lambda b=backend, f=flag: step(b, f))
               for side, (backend, flag) in chosen.items()}
        results[f"decode x{batch}"] = alternate(fns, args.pairs)
        log(f"  engine decode x{batch:>3}: " + "  ".join(
            f"{s} {r['median']:.1f} [{r['min']:.1f}-{r['max']:.1f}]"
            for s, r in results[f"decode x{batch}"].items()))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="HEAD", help="git revision of the 'before' side")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (0: torch's own)")
    ap.add_argument("--context", type=int, default=128, help="tokens of context per decode")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--kernel-only", action="store_true", help="skip the engine part")
    ap.add_argument("--smoke", action="store_true", help="2 layers, 2 pairs, no engine part")
    args = ap.parse_args()
    args.batches = [1, 16, 64]
    if args.smoke:
        args.layers, args.pairs, args.context, args.kernel_only = 2, 2, 40, True
    if args.threads:
        torch.set_num_threads(args.threads)
    chosen = sides(args.against)
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads; sides {list(chosen)};"
        f" ms per step (all layers), median [min-max] of {args.pairs} alternating samples")
    with torch.inference_mode():
        result = {"kernel": kernel_part(args, chosen)}
        if not args.kernel_only:
            result["engine"] = engine_part(args, chosen)
    print(json.dumps({"bench": "cpu_attention_ab", "smoke": args.smoke,
                      "threads": torch.get_num_threads(), "context": args.context, **result}))


if __name__ == "__main__":
    main()
