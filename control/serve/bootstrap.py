"""Build what the engine loop owns from ServeSettings: the model, the engine, the processor.

The serving YAML is read twice on purpose: `load_config_file` validates it, and the raw
`serving:` keys say which settings the operator chose. Those are kept as written; the
others are fitted to the model exactly as the offline `LLM` does (max_model_len capped
at the model's, KV blocks sized to memory, defaults that do not fit capped), and the
prefill chunk and token budget to the device: steps measured on the model runner keep one
step under `target_step_ms` (engine/calibration/budget_fit.py; `EngineParts.step_fit` says
what and why). The YAML's settings and profiles are checked against that fitted config,
before the engine starts: a message names the fitted max_model_len, not the default.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from control.serve.settings import ServeSettings
from engine.calibration.budget_fit import StepFit
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.config.yaml_loader import KEY_ALIASES, check_profiles, load_config_file
from engine.engine import Engine
from engine.kv.events import KVEventLog
from engine.output.processor import OutputProcessor


@dataclass
class EngineParts:
    """Owned by the engine thread, except `frontend_tokenizer` (the routes' own copy:
    a fast tokenizer is not safe to share between threads) and the immutable configs."""

    engine: Engine
    processor: OutputProcessor
    frontend_tokenizer: Any
    vocab_size: int  # token ids a prompt may contain: 0 .. vocab_size - 1
    static: StaticConfig
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    step_fit: StepFit | None = None  # budgets fitted to the device at start-up, if any
    weights: str = ""  # the dtype the weights run in and why, for the ready line
    # static fields the model chose (max_model_len, num_kv_blocks): a reloaded YAML is
    # compared and checked against these as fitted (control/admin/config_watch.py)
    fitted_static: frozenset[str] = frozenset()

    @property
    def max_prompt_capacity(self) -> int:
        """Tokens one request may hold: max_model_len, and never more than the KV pool."""
        static = self.static
        return min(static.max_model_len, static.num_kv_blocks * static.block_size)


@dataclass(frozen=True)
class ServingConfig:
    """The YAML, validated: the settings it names (engine field -> value), its lanes and
    the rest of its live settings, and its profiles."""

    explicit: dict[str, Any]
    live: LiveConfig
    profiles: dict[str, dict[str, Any]]


def read_serving_config(path: str | None) -> ServingConfig:
    """Raises ValueError naming the bad field, before any model is loaded: keys, types and
    ranges. Checks against max_model_len and the KV pool wait for their fitted values
    (`build_parts`): the model decides them, so a default would give the wrong verdict."""
    if path is None:
        return ServingConfig({}, LiveConfig(), {})
    loaded = load_config_file(path)
    raw = (yaml.safe_load(Path(path).read_text()) or {}).get("serving") or {}
    config: EngineConfig = loaded.config
    explicit = {}
    for key in raw:
        name = KEY_ALIASES.get(key, key)
        source = config.static if hasattr(config.static, name) else config.live
        explicit[name] = getattr(source, name)
    return ServingConfig(explicit, config.live, loaded.profiles)


def server_torch_threads(cpus: int) -> int:
    """torch's intra-op threads for a CPU server: one core left to the event loop, the
    tokenizer and the trace where there are more than two. On two cores both go to the
    steps: `batchpilot loadtest` of the chat scenario against `make run`'s server on the
    2-core Xeon, 1 thread -> 2: TTFT p99 255 -> 202 ms, ITL p99 63 -> 19 ms at 0.8 req/s;
    474 -> 214 and 195 -> 80 ms at 4 req/s; output 203 -> 265 tok/s at 8 req/s; and
    `bench.serving_path` 646-680 -> 1027-1037 tok/s at saturation."""
    return cpus if cpus <= 2 else cpus - 1


def build_parts(settings: ServeSettings, loaded: Any = None) -> EngineParts:
    """Load the model (unless `loaded`, a LoadedModel, is given) and build the engine."""
    import torch

    from engine.execution.model_runner import ModelRunner
    from engine.llm import build_engine, fit_engine_config, fit_to_runner, fitted_static_fields
    from engine.models import load_model

    serving = read_serving_config(settings.config_path)
    if loaded is None:
        device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(server_torch_threads(os.cpu_count() or 2))
        loaded = load_model(settings.model, dtype=settings.dtype, device=device)
    overrides = {**serving.explicit, **settings.engine_overrides}
    config = fit_engine_config(loaded, overrides, base=serving.live)
    runner = ModelRunner(loaded, config.static.num_kv_blocks, config.static.block_size,
                         config.static.kv_cache_dtype)
    config, step_fit = fit_to_runner(config, set(overrides), runner)
    fitted = fitted_static_fields(config.static, overrides)
    check_profiles(serving.profiles, config, fitted)  # a bad profile fails the start
    engine = build_engine(loaded, config, runner, step_fit)
    if settings.kv_events:  # a fleet's precise router reads them (control/fleet/kv_index.py)
        engine.block_manager.publish_events(KVEventLog(), settings.prefix_hash_key)
    try:
        frontend = copy.deepcopy(loaded.tokenizer)
    except Exception:  # fall back to sharing; encode and decode do not mutate it
        frontend = loaded.tokenizer
    vocab = int(getattr(loaded.hf_config, "vocab_size", 0) or len(loaded.tokenizer))
    plan = loaded.dtype_plan
    weights = plan.describe() if plan is not None else str(loaded.dtype).removeprefix("torch.")
    kv = str(runner.kv_dtype).removeprefix("torch.")
    if torch.device(runner.device).type == "cpu":  # (asking loads the native library)
        kv += bf16_attention_note(runner.kv_dtype, loaded.model.head_dim)
    return EngineParts(engine, OutputProcessor(loaded.tokenizer), frontend, vocab,
                       config.static, serving.profiles, step_fit,
                       f"weights: {weights}; KV cache {kv}", fitted)


def bf16_attention_note(kv_dtype: Any, head_dim: int) -> str:
    """What of attention multiplies in bf16 on tiles here (kv_dtype a torch.dtype), for the
    ready line: " (attention on AMX: long prefill chunks, decodes over more than 16 keys)",
    the same "on AVX512-BF16" on a CPU without AMX, or ""."""
    from kernels import cpu_prefill_amx, native_library

    tiles: dict[str, list[str]] = {}
    prefill = cpu_prefill_amx.serving_tiles(kv_dtype, head_dim)
    if prefill:
        tiles.setdefault(prefill, []).append("long prefill chunks")
    decodes = native_library.bf16_decode_tiles(kv_dtype, head_dim)
    if decodes:
        tiles.setdefault(decodes, []).append("decodes over more than 16 keys")
    parts = [f"{kind}: {', '.join(whats)}" for kind, whats in tiles.items()]
    return f" (attention on {'; on '.join(parts)})" if parts else ""
