"""Load a checkpoint into our model: transformers supplies config, tokenizer and weights.

Two kinds of source (see sources.py):

- a checkpoint directory: AutoConfig / AutoTokenizer read it, weights come straight from
  its *.safetensors files (no transformers model is built);
- a .gguf file: transformers parses and dequantizes it (`gguf_file=`); a GGUF model cannot
  be save_pretrained as is, so we build transformers' model once and adopt its weights.
  Each transformers call re-parses the GGUF metadata (~8 s for SmolLM2-135M on this CPU),
  and mapping tensor names costs ~12 s more, so a GGUF load takes ~40 s (config 8 s,
  tokenizer 8 s, weights 22 s); the config is passed on to save a fourth parse.
  save_checkpoint() converts once to a directory that loads in ~2 s; gguf_cache.py keeps
  such a copy of every GGUF loaded in float32 and reads it on later loads.

Every transformers call passes local_files_only=True: nothing is fetched from a hub.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from engine.models import gguf_cache
from engine.models.cpu_dtype import DtypePlan, resolve_dtype
from engine.models.gguf_blocks import attach_gguf_blocks
from engine.models.llama import LlamaForCausalLM
from engine.models.registry import architecture_of, get_model_class
from engine.models.sources import resolve_model_source


@dataclass
class LoadedModel:
    """A model ready to run on the paged cache, with what the engine needs around it.

    max_model_len: longest context served exactly (max_position_embeddings, capped at the
    sliding window for configs that use one, since attention here is full-context);
    eos_token_ids: every id that ends generation (config, generation config, tokenizer);
    reference: the transformers model (eager attention) when load_model(keep_reference=True);
    dtype_plan: what the dtype choice resolved to (dtype equals dtype_plan.dtype, the KV
    cache's and the weights' as loaded; see cpu_dtype.py for bf16 projection copies).
    """

    model: LlamaForCausalLM
    hf_config: Any
    tokenizer: Any
    source: Path
    architecture: str
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    load_seconds: float
    reference: nn.Module | None = None
    dtype_plan: DtypePlan | None = None  # None: built without a plan, plain `dtype`


def load_model(
    source: str | os.PathLike[str],
    dtype: str | torch.dtype = "auto",
    device: torch.device | str = "cpu",
    *,
    keep_reference: bool = False,
) -> LoadedModel:
    """Load an alias, checkpoint directory or .gguf file (see resolve_model_source).

    dtype: "auto" | "float32" | "bfloat16" or a torch dtype (cpu_dtype.py). "auto", the
    default everywhere (`LLM(name)`, `batchpilot serve`), so `LLM(load_model(name))` runs
    as `LLM(name)` does; ask for "float32" where exactness against transformers is the
    point (the parity tests do). keep_reference=True also returns the transformers model
    (in the plan's dtype) for parity checks; for a GGUF source it costs nothing extra.
    """
    from transformers import AutoConfig, AutoTokenizer  # heavy import, deferred

    started = time.perf_counter()
    original = path = resolve_model_source(source)
    converted = gguf_cache.lookup(path) if path.is_file() else None
    path = converted or path
    device = torch.device(device)
    plan = resolve_dtype(dtype, device)  # fail on a bad value before the slow part
    dtype = plan.dtype
    hf_kwargs: dict[str, Any] = {"local_files_only": True}
    if path.is_file():  # .gguf
        directory, hf_kwargs["gguf_file"] = path.parent, path.name
    else:
        directory = path
    config = AutoConfig.from_pretrained(directory, **hf_kwargs)
    architecture = architecture_of(config)
    model_class = get_model_class(architecture)  # fail before the slow part
    tokenizer = AutoTokenizer.from_pretrained(directory, **hf_kwargs)

    is_gguf = "gguf_file" in hf_kwargs
    hf_model = None
    if keep_reference or is_gguf:
        hf_model = _load_hf_model(directory, config, dtype, hf_kwargs)
    state = hf_model.state_dict() if is_gguf else read_safetensors(directory)
    model = build_model(model_class, config, state, dtype, device)
    model.keep_bf16_copies(plan.bf16_min_rows)
    if original.is_file() and plan.choice == "auto" and plan.bf16_min_rows is not None:
        blocks = attach_gguf_blocks(model, original)  # small decode steps read the GGUF's own
        plan = plan if blocks is None else replace(plan, reason=f"{plan.reason}; {blocks}")
    reference = hf_model.to(device) if keep_reference else None
    loaded = LoadedModel(
        model=model,
        hf_config=config,
        tokenizer=tokenizer,
        source=original,
        architecture=architecture,
        dtype=dtype,
        device=device,
        max_model_len=max_model_len_of(config),
        eos_token_ids=eos_token_ids_of(config, tokenizer, directory),
        load_seconds=time.perf_counter() - started,
        reference=reference,
        dtype_plan=plan,
    )
    if is_gguf and dtype == torch.float32:  # next time: safetensors, ~20x faster
        gguf_cache.store(original, lambda out: save_checkpoint(loaded, out))
    return loaded


def _load_hf_model(directory: Path, config: Any, dtype: torch.dtype, hf_kwargs: dict) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        directory, config=config, dtype=dtype, attn_implementation="eager", **hf_kwargs
    )
    return model.eval().requires_grad_(False)


def build_model(
    model_class: type[LlamaForCausalLM],
    config: Any,
    state: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device,
) -> LlamaForCausalLM:
    """Build on the meta device (no random init), then adopt `state`'s tensors, converted
    to dtype/device (no copy when they already match: a GGUF model's weights are shared,
    except q/k/v and gate/up, which the model's load hooks concatenate into fused weights).

    Tied checkpoints may omit lm_head.weight. Missing or unexpected weights raise ValueError.
    """
    with torch.device("meta"):
        model = model_class(config)
    state = {
        name: tensor.to(device=device, dtype=dtype)
        for name, tensor in state.items()
        if not name.endswith("rotary_emb.inv_freq")
    }
    if getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in state:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"checkpoint does not match {model_class.__name__}: "
            f"missing {result.missing_keys[:8]}, unexpected {result.unexpected_keys[:8]}"
        )
    model.tie_weights()  # assign=True replaced lm_head.weight with its own tensor
    return model.eval().requires_grad_(False)


def save_checkpoint(loaded: LoadedModel, out_dir: str | os.PathLike[str]) -> Path:
    """Write config, tokenizer and weights (safetensors, in the model's dtype) to a
    checkpoint directory that load_model reads in about a second: convert a GGUF once
    instead of dequantizing it at every start."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(loaded.hf_config)
    config.architectures = [loaded.architecture]
    config.save_pretrained(out)
    loaded.tokenizer.save_pretrained(out)
    # state_dict() gives q/k/v and gate/up as views of the fused weights; safetensors
    # refuses tensors sharing storage, so each is written from its own copy.
    state = {name: t.clone() for name, t in loaded.model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        del state["lm_head.weight"]  # restored from embed_tokens when loading
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) safetensors checkpoint, on CPU, stored dtype."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / name for name in names]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{str(directory)!r} has no *.safetensors weights (pytorch_model.bin is not "
            "supported: re-save with save_pretrained(), which writes safetensors)"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file), device="cpu"))
    return state


def max_model_len_of(config: Any) -> int:
    """max_position_embeddings, capped at the sliding window when the config uses one."""
    limit = int(config.max_position_embeddings)
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        limit = min(limit, int(window))
    return limit


def eos_token_ids_of(config: Any, tokenizer: Any, directory: Path) -> tuple[int, ...]:
    """Ordered, de-duplicated end-of-sequence ids from config, generation_config.json and
    tokenizer."""
    found: list[int] = []
    sources: list[Any] = [getattr(config, "eos_token_id", None)]
    generation_config = directory / "generation_config.json"
    if generation_config.is_file():
        sources.append(json.loads(generation_config.read_text()).get("eos_token_id"))
    sources.append(getattr(tokenizer, "eos_token_id", None))
    for value in sources:
        for token_id in value if isinstance(value, (list, tuple)) else [value]:
            if token_id is not None and int(token_id) not in found:
                found.append(int(token_id))
    return tuple(found)
