"""The profiled split of bench.roofline_steps' step: which category each torch.profiler event
of a step belongs to, and the per-category ms of a few profiled steps.

Categories come from the profiler's event tree: attention modules get a `record_function`
label through forward hooks (a public nn.Module API, installed only for the profiled steps);
sampling is every op whose Python stack passes through engine/execution/sampler.py;
projections are matmul-family ops outside those; the rest, and the host time between ops,
is "other".
"""

from __future__ import annotations

import statistics

from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from engine.execution.model_runner import ModelRunner
from engine.models import Attention
from engine.records import SchedulerOutput

STEP_LABEL, ATTENTION_LABEL = "bench::step", "bench::attention"
# matmul-family op names (after "aten::", "mkldnn::", ...): a projection unless inside attention
PROJECTION_OPS = {"linear", "addmm", "mm", "matmul", "bmm", "baddbmm", "_addmm_activation",
                  "_linear_pointwise", "mkldnn_linear", "_weight_int8pack_mm",
                  "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu"}
# In Python frames' names: the sampler; a projection (oneDNN's ops, or the AMX kernel over
# Q4_1 tiles, a native call whose time is its Python frame's); the attention backends
SAMPLER_FILE, PROJECTION_FILE = "engine/execution/sampler.py", "engine/models/projections.py"
ATTENTION_FILES = ("kernels/cpu_attention.py", "kernels/cpu_prefill", "kernels/cpu_plan.py",
                   "kernels/native_library.py", "kernels/reference.py", "kernels/triton",
                   "kernels/backends.py")
NATIVE_LAYERS_FILE = "kernels/cpu_layers.py"  # all layers of a small decode step in one call
CATEGORIES = ("projections", "attention", "native_layers", "sampling", "other")


def label_attention(model: nn.Module) -> list:
    """Forward hooks that wrap every attention module's forward in ATTENTION_LABEL."""
    open_ranges: list[record_function] = []

    def enter(module, args):
        open_ranges.append(record_function(ATTENTION_LABEL).__enter__())

    def leave(module, args, output):
        open_ranges.pop().__exit__(None, None, None)

    handles = []
    for module in model.modules():
        if isinstance(module, Attention):
            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave))
    return handles


def categorise(event) -> tuple[str, int] | None:
    """(category, id of the profiled step) of one profiler event, its self time counting
    there, from its ancestry, which with_stack=True interleaves with Python frames
    ("engine/execution/sampler.py(52): sample"): native layers (a kernels/cpu_layers.py frame: the
    projections, attention and elementwise work of every layer in one native call) >
    projections (a Projection.forward frame) > attention (label, or an attention backend's
    frame) > sampling (a sampler frame) > projections (a matmul-family op elsewhere) >
    other (the fused elementwise calls between projections among it). None: outside every
    step."""
    chain, node = [], event
    while node is not None:
        chain.append(node)
        node = node.cpu_parent
    steps = [e for e in chain if e.name == STEP_LABEL]
    if not steps:
        return None
    names = [e.name for e in chain]
    if any(NATIVE_LAYERS_FILE in n for n in names):
        category = "native_layers"
    elif any(PROJECTION_FILE in n for n in names):
        category = "projections"
    elif ATTENTION_LABEL in names or any(f in n for n in names for f in ATTENTION_FILES):
        category = "attention"
    elif any(SAMPLER_FILE in n for n in names):
        category = "sampling"
    elif any(n.rsplit("::", 1)[-1] in PROJECTION_OPS for n in names):
        category = "projections"
    else:
        category = "other"
    return category, steps[0].id


PROFILE_TRIES = 3


def profiled_events(runner: ModelRunner, out: SchedulerOutput, steps: int) -> list:
    """The profiler's events of `steps` labelled executes. NOTE: with_stack keeps Python
    frame names as pointers into code objects; one freed inside the profiled region leaves
    an event whose name is not UTF-8 when the results are parsed (pytorch/pytorch#64345,
    seen once in CI). Such a capture is thrown away and taken again, up to PROFILE_TRIES."""
    attempt = 0
    while True:
        attempt += 1
        handles = label_attention(runner.model)
        try:
            with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
                for _ in range(steps):
                    with record_function(STEP_LABEL):
                        runner.execute(out)
        finally:
            for handle in handles:
                handle.remove()
        try:
            return list(prof.events())
        except UnicodeDecodeError:
            if attempt == PROFILE_TRIES:
                raise


def profile_split(runner: ModelRunner, out: SchedulerOutput, steps: int) -> dict:
    """Per category, ms per profiled step: median and min over the steps (each step's own
    sum); the host time between ops (part of other); the costliest other ops (mean)."""
    per_step: dict[int, dict[str, float]] = {}  # step event id -> category -> µs
    other_ops: dict[str, float] = {}
    for event in profiled_events(runner, out, steps):
        found = categorise(event)
        if found is None:
            continue
        category, step = found
        totals = per_step.setdefault(step, dict.fromkeys((*CATEGORIES, "host", "total"), 0.0))
        totals[category] += event.self_cpu_time_total
        if event.name == STEP_LABEL:
            totals["host"], totals["total"] = event.self_cpu_time_total, event.cpu_time_total
        elif category == "other":
            other_ops[event.name] = other_ops.get(event.name, 0.0) + event.self_cpu_time_total
    top = sorted(other_ops.items(), key=lambda kv: -kv[1])[:6]
    return {name: {"median": statistics.median(t[name] for t in per_step.values()) / 1e3,
                   "min": min(t[name] for t in per_step.values()) / 1e3}
            for name in (*CATEGORIES, "host", "total")} | {
        "other_top_ops_ms": {name: us / steps / 1e3 for name, us in top}}
