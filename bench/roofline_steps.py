"""The engine's step for bench.cpu_roofline: fake requests through the real
`ModelRunner.execute`, its time split by torch.profiler, and its FLOPs against the ceilings.

Nothing here edits or patches the engine. The profiled split by category is
bench/roofline_profile.py's. Weight shapes and counts are read from the model's modules, so
fused or unfused projections and any weight dtype are measured as they are.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from bench.roofline_profile import CATEGORIES, profile_split
from engine.execution.model_runner import ModelRunner
from engine.records import PrefillChunk, SchedulerOutput
from engine.request import Request, SamplingParams

TABLE_HEADER = ("  step         wall ms p50 [min-max]  profiled ms p50 and share of the profiled"
                " step, by category        GFLOP/s step (proj)  ceiling GFLOP/s, bound, step"
                " share (proj share) per dtype  weights streamed per step, GB/s")
TABLE_LEGEND = (
    "  wall: unprofiled steps; profiled: with torch.profiler (with_stack), which slows Python"
    " most, so its overhead lands mostly in 'other' (host: Python between ops);\n"
    "  GFLOP/s (best vs best): step = (projection + attention FLOPs) / fastest wall, proj ="
    " projection FLOPs / fastest profiled projection time; ceiling: projection FLOPs over"
    " max(GEMM time at the best measured rate per shape, best weight-streaming pass);\n"
    "  weights streamed: the projection weights the step reads, in the dtype it runs them"
    " (bf16 copies on steps that use them), over the fastest wall")


@dataclass(frozen=True)
class StepShape:
    name: str
    decodes: int  # sequences decoding one token each
    context: int  # tokens of context per decode, this step's token included
    prefill: int  # prefill tokens from position 0 (0: none), split over `prompts` prompts
    prompts: int = 1  # fresh prompts sharing the prefill tokens (the first ones 1 longer)

    @property
    def tokens(self) -> int:
        return self.decodes + self.prefill

    @property
    def sample_rows(self) -> int:
        return self.decodes + (self.prompts if self.prefill else 0)

    def prompt_lengths(self) -> list[int]:
        """Tokens of each prompt of the prefill ([] without one)."""
        if not self.prefill:
            return []
        base, extra = divmod(self.prefill, self.prompts)
        return [base + (1 if i < extra else 0) for i in range(self.prompts)]


def linear_weights(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(module name, weight [out, in]) of every module with a 2-D weight except embeddings,
    in module order (the decode order: layer by layer, then lm_head); shared weights once."""
    found, seen = [], set()
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Embedding) or not isinstance(weight, torch.Tensor):
            continue
        if weight.dim() == 2 and id(weight) not in seen:
            seen.add(id(weight))
            found.append((name, weight))
    return found


def is_vocab(name: str) -> bool:
    """lm_head runs on the sample rows only; every other weight on every token."""
    return name.rsplit(".", 1)[-1] == "lm_head"


def streamed_weights(model: nn.Module, shape: StepShape) -> list[tuple[str, torch.Tensor, int]]:
    """(name, the weight tensor the step multiplies by, rows) per linear weight: the bf16
    copy (Projection.weight_bf16, a non-persistent buffer, so not in parameters()) where the
    model runs a call of that many rows on it (model.uses_bf16: >= BF16_MIN_ROWS tokens, or
    sample rows for lm_head, under dtype auto), else the weight itself."""
    uses_bf16 = getattr(model, "uses_bf16", lambda rows: False)
    modules = dict(model.named_modules())
    out = []
    for name, weight in linear_weights(model):
        rows = shape.sample_rows if is_vocab(name) else shape.tokens
        copy = getattr(modules[name], "weight_bf16", None)
        out.append((name, copy if copy is not None and uses_bf16(rows) else weight, rows))
    return out


def model_info(loaded) -> dict:
    """Parameters, and the resident bytes of the linear weights: both copies where a
    projection keeps a bf16 twin (its buffer is not a parameter)."""
    weights = linear_weights(loaded.model)
    params = {id(p): p for p in loaded.model.parameters()}.values()
    modules = dict(loaded.model.named_modules())
    copies = [c for name, _ in weights
              if (c := getattr(modules[name], "weight_bf16", None)) is not None]
    return {"architecture": loaded.architecture, "dtype": str(loaded.dtype).replace("torch.", ""),
            "weight_dtypes": sorted({str(w.dtype).replace("torch.", "")
                                     for w in [w for _, w in weights] + copies}),
            "params": sum(p.numel() for p in params),
            "linear_weight_bytes": sum(w.numel() * w.element_size()
                                       for w in [w for _, w in weights] + copies)}


def projection_shapes(model: nn.Module) -> dict[tuple[int, int], str]:
    """(in, out) -> label: the config's projections fused and unfused, plus the model's own."""
    cfg = model.config
    hidden, heads, kv_heads = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    inter, vocab = cfg.intermediate_size, cfg.vocab_size
    canonical = [((hidden, (heads + 2 * kv_heads) * head_dim), "qkv"), ((hidden, heads * head_dim),
                 "q"), ((hidden, kv_heads * head_dim), "k,v"), ((heads * head_dim, hidden), "o"),
                 ((hidden, 2 * inter), "gate_up"), ((hidden, inter), "gate,up"),
                 ((inter, hidden), "down"), ((hidden, vocab), "lm_head")]
    canonical += [((w.shape[1], w.shape[0]), name.rsplit(".", 1)[-1])
                  for name, w in linear_weights(model)]
    shapes: dict[tuple[int, int], str] = {}
    for key, label in canonical:
        if label not in shapes.get(key, "").split("/"):
            shapes[key] = f"{shapes[key]}/{label}" if key in shapes else label
    return shapes


def blocks_needed(batch: int, context: int, prefill: int, block_size: int,
                  prompts: int = 1) -> int:
    """KV blocks for `batch` decodes at `context` and `prefill` tokens over `prompts` prompts
    (each prompt's last block partly used: at most one spare block each), plus one."""
    return batch * -(-context // block_size) + -(-prefill // block_size) + prompts + 1


def build_step(shape: StepShape, vocab: int, block_size: int, temperature: float,
               seed: int = 0) -> SchedulerOutput:
    """Fake requests, each owning its own blocks: decodes at `context` (all but the last
    token computed), then one whole-prompt chunk per fresh prompt, each of which samples."""
    rng, next_block = random.Random(seed), 0
    params = SamplingParams(max_tokens=1, temperature=temperature, ignore_eos=True, seed=seed)

    def request(i: int, length: int, computed: int) -> Request:
        nonlocal next_block
        req = Request(f"bench-{i}", [rng.randrange(vocab) for _ in range(length)], params, 0.0)
        req.num_computed_tokens = computed
        owned = -(-length // block_size)
        req.block_ids = list(range(next_block, next_block + owned))
        next_block += owned
        return req

    decodes = [request(i, shape.context, shape.context - 1) for i in range(shape.decodes)]
    prefills = [PrefillChunk(request(shape.decodes + i, length, 0), length, True)
                for i, length in enumerate(shape.prompt_lengths())]
    return SchedulerOutput(0, decodes, prefills, config_version=0, token_budget=shape.tokens,
                           num_decode_tokens=shape.decodes, num_prefill_tokens=shape.prefill)


def ms_per_step(runner: ModelRunner, out: SchedulerOutput, steps: int) -> float:
    """ms per runner.execute(out): the mean of `steps` steps after one untimed step."""
    runner.execute(out)
    started = time.perf_counter()
    for _ in range(steps):
        runner.execute(out)
    return (time.perf_counter() - started) / steps * 1e3


def measure_step(runner: ModelRunner, shape: StepShape, steps: int, profiled: int,
                 temperature: float) -> dict:
    """Wall ms of `steps` unprofiled executes (after 2 warm-ups), then `profiled` more
    under the profiler, split by category."""
    vocab = runner.model.config.vocab_size
    out = build_step(shape, vocab, runner.block_size, temperature)
    for _ in range(2):
        runner.execute(out)
    walls = []
    for _ in range(steps):
        started = time.perf_counter()
        runner.execute(out)
        walls.append((time.perf_counter() - started) * 1e3)
    return {"tokens": shape.tokens, "sample_rows": shape.sample_rows,
            "wall_ms": {"median": statistics.median(walls), "min": min(walls), "max": max(walls)},
            "profiled_ms": profile_split(runner, out, profiled)}


def best_rate(table: dict, rows: int) -> float:
    """Best GFLOP/s at `rows`, or at the nearest measured row count (log scale)."""
    measured = [int(k) for k in table if k.isascii() and k.isdecimal()]  # row counts
    near = min(measured, key=lambda n: abs(math.log(n / rows)))
    return table[str(near)]["max"]


def roofline(model: nn.Module, shape: StepShape, row: dict, gemm: dict, stream: dict) -> dict:
    """FLOPs of the step, achieved GFLOP/s and the ideal projection time per dtype, best
    against best: the fastest step (and its fastest profiled projections) over the fastest
    sample of each ceiling (contention on a shared machine only ever slows a sample)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_query = 4 * head_dim * cfg.num_attention_heads * cfg.num_hidden_layers  # QK + PV
    keys = shape.decodes * shape.context + shape.prefill * (shape.prefill + 1) // 2
    attn_flops = per_query * keys
    streamed = streamed_weights(model, shape)
    work = [(w.shape[1], w.shape[0], rows) for _, w, rows in streamed]
    proj_flops = sum(2 * rows * d_in * d_out for d_in, d_out, rows in work)
    weight_bytes = sum(w.numel() * w.element_size() for _, w, _ in streamed)
    wall_s = row["wall_ms"]["min"] / 1e3
    # a native-layers step's projections run inside that call, with its attention and
    # elementwise work: their time is bounded by the whole call's (a lower bound on rate)
    split = row["profiled_ms"]
    proj_s = (split["projections"]["min"] + split["native_layers"]["min"]) / 1e3
    step_gflops = (proj_flops + attn_flops) / wall_s / 1e9
    proj_gflops = proj_flops / proj_s / 1e9 if proj_s else 0.0
    # weight_mb: what this step's projections read once each (its dtype path); weight_gb_s
    # over the fastest wall is the streaming rate a batch-1 step is judged by
    out = {"proj_gflop": proj_flops / 1e9, "attn_gflop": attn_flops / 1e9,
           "tokens_per_s": shape.tokens / wall_s, "step_gflops": step_gflops,
           "proj_gflops": proj_gflops, "weight_mb": weight_bytes / 1e6,
           "weight_dtypes": sorted({str(w.dtype).replace("torch.", "") for _, w, _ in streamed}),
           "weight_gb_s": weight_bytes / wall_s / 1e9, "ceiling": {}}
    for dtype, table in gemm.items():
        compute_s = sum(2 * rows * d_in * d_out / (best_rate(table[f"{d_in}x{d_out}"], rows) * 1e9)
                        for d_in, d_out, rows in work)
        stream_s = stream[dtype]["ms_per_pass"]["min"] / 1e3
        ideal_s = max(compute_s, stream_s)
        ceiling = proj_flops / ideal_s / 1e9
        out["ceiling"][dtype] = {
            "gflops": ceiling, "ideal_ms": ideal_s * 1e3,
            "bound": "streaming" if stream_s > compute_s else "gemm",
            "step_ratio": step_gflops / ceiling, "proj_ratio": proj_gflops / ceiling}
    return out


def format_row(name: str, row: dict) -> str:
    wall, split = row["wall_ms"], row["profiled_ms"]
    total = sum(split[k]["median"] for k in CATEGORIES) or 1.0  # shares of the medians
    parts = "  ".join(f"{short} {split[k]['median']:6.1f} {split[k]['median'] / total:4.0%}"
                      for k, short in zip(CATEGORIES, ("proj", "attn", "native", "samp", "other"),
                                          strict=True))
    ratios = "  ".join(f"{k} {c['gflops']:5.0f} {c['bound'][:6]:<6} {c['step_ratio']:5.1%}"
                       f" ({c['proj_ratio']:5.1%})" for k, c in row["ceiling"].items())
    return (f"  {name:<12} {wall['median']:7.1f} [{wall['min']:.1f}-{wall['max']:.1f}]"
            f"  {parts} (host {split['host']['median']:4.1f})"
            f"  {row['step_gflops']:6.1f} ({row['proj_gflops']:6.1f})  {ratios}"
            f"  {row['weight_mb']:6.1f} MB {'+'.join(row['weight_dtypes'])}"
            f" {row['weight_gb_s']:5.1f} GB/s")
