"""The offline API: `LLM(model).generate(prompts, params)` and `.chat(messages, params)`.

    from engine import LLM, SamplingParams
    llm = LLM("smollm2-135m", max_num_seqs=32)
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0))
    print(outs[0].text, outs[0].finish_reason, outs[0].metrics.ttft_s)

Keyword overrides are engine config fields (static or live), e.g. `max_num_seqs`,
`prefill_chunk_size`, `num_kv_blocks`, `max_model_len`; unknown names are refused.
`dtype` ("auto", the default, "float32" or "bfloat16"; engine/models/cpu_dtype.py) applies
when LLM loads the model; a LoadedModel keeps the dtype it was loaded with (`load_model`'s
default is "auto" too, so `LLM(load_model(name))` runs as `LLM(name)` does).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from engine.calibration.budget_fit import StepFit, fit_step_budgets, needs_fit
from engine.calibration.probe import RunnerProbe
from engine.calibration.thread_governor import ThreadGovernor
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.config.dtype_option import DTYPE_CHOICES
from engine.config.field_types import check_field_types
from engine.config.schema import FIELD_TYPES
from engine.engine import Engine
from engine.execution.model_runner import ModelRunner, auto_num_kv_blocks
from engine.gc_heap import heap_frozen
from engine.models import LoadedModel, load_model
from engine.models.cpu_dtype import parse_dtype
from engine.output.processor import OutputProcessor, RequestOutput
from engine.records import AdmissionDecision
from engine.request import RequestStatus, SamplingParams

_STATIC = {f.name for f in dataclasses.fields(StaticConfig)}
_LIVE = {f.name for f in dataclasses.fields(LiveConfig)} - {"version"}
# Rejections that clear once requests in flight finish; with none in flight they never do.
_WAIT_FOR_ROOM = frozenset({"queue_full", "kv_reject_watermark"})

Prompt = str | list[int]


class PromptRejected(ValueError):
    """The engine refused a prompt for a reason waiting cannot clear; `decision` says why."""

    def __init__(self, index: int, decision: AdmissionDecision):
        super().__init__(f"prompt {index} rejected ({decision.reason}): {decision.message}")
        self.index = index
        self.decision = decision


class LLM:
    def __init__(self, model: str | LoadedModel = "smollm2-135m", *, device: str | None = None,
                 dtype: str | torch.dtype | None = None, **overrides: Any):
        """`model`: an alias, a checkpoint directory, a .gguf file, or a LoadedModel."""
        check_overrides(overrides, "LLM")  # before the model loads: a typo costs no load
        if isinstance(model, LoadedModel):
            if dtype is not None:
                raise ValueError(f"{dtype=} applies only when LLM loads the model: pass it to"
                                 " load_model(), or pass LLM the model's name or path")
            self.loaded = model
        else:
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            self.loaded = load_model(model, dtype=parse_dtype(dtype), device=device)
        self.tokenizer = self.loaded.tokenizer
        config = fit_engine_config(self.loaded, overrides)
        runner = ModelRunner(self.loaded, config.static.num_kv_blocks, config.static.block_size,
                             config.static.kv_cache_dtype)
        if "target_step_ms" in overrides:  # offline runs fit step budgets only when asked
            config, self.step_fit = fit_to_runner(config, set(overrides), runner)
        else:
            self.step_fit = None
        self.engine = build_engine(self.loaded, config, runner, self.step_fit)
        self.runner = self.engine.executor
        self.processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    # ---- public API --------------------------------------------------------------------
    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for each prompt (text or token ids); outputs in prompt order. A text
        prompt gets the tokenizer's special tokens (a BOS, for tokenizers that add one), as
        vLLM's generate and our /v1/completions give them."""
        return self._generate(prompts, params, use_tqdm, add_special_tokens=True)

    def chat(self, messages: list[dict] | Sequence[list[dict]],
             params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             use_tqdm: bool = True) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or several, through the
        tokenizer's chat template with the assistant turn opened; no special tokens beyond
        the template's own (vLLM's chat and our /v1/chat/completions add none)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(list(c), tokenize=False,
                                                      add_generation_prompt=True)
                   for c in conversations]
        return self._generate(prompts, params, use_tqdm, add_special_tokens=False)

    # ---- internals ---------------------------------------------------------------------
    def _generate(self, prompts: Prompt | Sequence[Prompt],
                  params: SamplingParams | Sequence[SamplingParams] | None, use_tqdm: bool,
                  add_special_tokens: bool) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt
        prompts = list(prompts)
        param_list = [self._compile_format(p) for p in self._params_per_prompt(params,
                                                                             len(prompts))]
        encoded = [self._encode(i, p, param_list[i], add_special_tokens)
                   for i, p in enumerate(prompts)]
        return self._run(prompts, encoded, param_list, use_tqdm)

    @staticmethod
    def _params_per_prompt(params: SamplingParams | Sequence[SamplingParams] | None,
                           n: int) -> list[SamplingParams]:
        if params is None or isinstance(params, SamplingParams):
            return [params or SamplingParams()] * n
        params = list(params)
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts: pass one,"
                             " or one per prompt")
        return params

    def _compile_format(self, params: SamplingParams) -> SamplingParams:
        """`params` with its structured output's grammar compiled for this model, here on
        the caller's thread (engine/structured); a bad schema raises ValueError."""
        if params.structured_output is None:
            return params
        from engine.structured.grammar import bind_params, cache_for  # imports xgrammar

        vocab = int(self.loaded.hf_config.vocab_size)  # the logits' width
        return bind_params(params, lambda: cache_for(self.tokenizer, vocab,
                                                     self.loaded.eos_token_ids))

    def _encode(self, index: int, prompt: Prompt, params: SamplingParams,
                add_special_tokens: bool) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {index} is empty: send at least one token")
        vocab = int(getattr(self.loaded.hf_config, "vocab_size", 0) or len(self.tokenizer))
        outside = {"prompt": sorted({t for t in ids if not 0 <= t < vocab}),
                   **params.token_ids_outside(vocab)}
        for name, bad in outside.items():  # an id past the vocabulary fails the whole step
            if bad:
                raise ValueError(f"prompt {index}: {name} token ids {bad[:8]} are outside"
                                 f" the vocabulary 0..{vocab - 1}")
        limit = self.engine.static.max_model_len
        if len(ids) + params.max_tokens > limit:
            raise ValueError(f"prompt {index} has {len(ids)} tokens and max_tokens is"
                             f" {params.max_tokens}: {len(ids) + params.max_tokens} is over"
                             f" max_model_len={limit}")
        return ids

    def _run(self, prompts: list[Prompt], encoded: list[list[int]],
             params: list[SamplingParams], use_tqdm: bool) -> list[RequestOutput]:
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        results: dict[str, RequestOutput] = {}
        pending = list(range(len(prompts)))[::-1]  # submitted as the queue has room
        bar = tqdm(total=len(prompts), desc="generating", unit="req", disable=not use_tqdm)
        try:
            with heap_frozen():  # no collection walks the model's objects meanwhile
                self._drive(pending, ids, prompts, encoded, params, results, bar)
        except PromptRejected:
            self._abandon()  # what this call submitted: the LLM stays usable
            raise
        finally:
            bar.close()
        return [results[i] for i in ids]

    def _drive(self, pending: list[int], ids: list[str], prompts: list[Prompt],
               encoded: list[list[int]], params: list[SamplingParams],
               results: dict[str, RequestOutput], bar: tqdm) -> None:
        """Submit and step until every prompt of the call has finished."""
        while pending or self.engine.has_unfinished_requests():
            self._submit(pending, ids, prompts, encoded, params)
            for out in self._step():
                results[out.request_id] = out
                bar.update(1)

    def _submit(self, pending: list[int], ids: list[str], prompts: list[Prompt],
                encoded: list[list[int]], params: list[SamplingParams]) -> None:
        """Submit pending prompts (from the end) until the engine is full for now."""
        engine = self.engine
        while pending:
            i = pending[-1]
            decision = engine.add_request(ids[i], encoded[i], params[i])
            if not decision.accepted:
                # Full for now: step, then submit the rest. Only while requests are in
                # flight: on an idle engine nothing will make room, so waiting would loop
                # forever.
                if decision.reason in _WAIT_FOR_ROOM and engine.requests:
                    return
                raise PromptRejected(i, decision)
            prompt_text = prompts[i] if isinstance(prompts[i], str) else None
            self.processor.add(ids[i], prompt_text, encoded[i], params[i])
            pending.pop()

    def _step(self) -> list[RequestOutput]:
        """One engine step; the outputs of requests that finished in it."""
        step = self.engine.step()
        outputs, stopped = self.processor.process(step)
        for request_id in stopped:
            self.engine.abort(request_id, RequestStatus.STOPPED, "stop string")
        return [out for out in outputs if out.finished]

    def _abandon(self) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
        while self.engine.has_unfinished_requests():
            self._step()


def fit_engine_config(loaded: LoadedModel, overrides: dict[str, Any] | None = None, *,
                      base: LiveConfig | None = None) -> EngineConfig:
    """The engine config for `loaded`: `overrides` (engine config fields, static or live) over
    `base` (LiveConfig() when None). What is not overridden is fitted to the model:
    max_model_len capped at the model's, num_kv_blocks sized to the memory left, and live
    defaults that do not fit a small model or KV pool capped. Raises ValueError naming a
    field that is unknown or out of range; the live settings are checked against this
    fitted static config, never against the defaults."""
    overrides = dict(overrides or {})
    check_overrides(overrides, "engine")
    static_kw = {k: v for k, v in overrides.items() if k in _STATIC}
    static_kw["max_model_len"] = min(static_kw.get("max_model_len", 1 << 30),
                                     loaded.max_model_len)
    block_size = static_kw.get("block_size", StaticConfig.block_size)
    kv_cache_dtype = static_kw.get("kv_cache_dtype", StaticConfig.kv_cache_dtype)
    if kv_cache_dtype not in DTYPE_CHOICES:  # StaticConfig refuses it, naming the field
        kv_cache_dtype = StaticConfig.kv_cache_dtype
    static_kw.setdefault("num_kv_blocks", auto_num_kv_blocks(loaded, block_size, kv_cache_dtype))
    static = StaticConfig(**static_kw)
    live = (base or LiveConfig()).replace(**{k: v for k, v in overrides.items() if k in _LIVE})
    live = _fit_live_to_static(live, static, explicit=set(overrides))
    return EngineConfig(static, live).validate(fitted_static_fields(static, overrides))


def check_overrides(overrides: dict[str, Any], kind: str) -> None:
    """ValueError for an override that is no engine config field, or whose value has the
    wrong type (engine/config/field_types.py); `kind` names the caller's options."""
    unknown = sorted(set(overrides) - _STATIC - _LIVE)
    if unknown:
        raise ValueError(f"unknown {kind} option(s) {unknown}; engine options are: "
                         f"{sorted(_STATIC | _LIVE)}")
    check_field_types(overrides, "", FIELD_TYPES)


def fitted_static_fields(static: StaticConfig, overrides: dict[str, Any]) -> frozenset[str]:
    """The static fields whose value the model chose, not `overrides`: max_model_len when
    not given or capped at the model's context, num_kv_blocks when not given. Messages name
    them "fitted to the model": the operator wrote another value, or none."""
    return frozenset(name for name in ("max_model_len", "num_kv_blocks")
                     if overrides.get(name) != getattr(static, name))


def build_engine(loaded: LoadedModel, config: EngineConfig,
                 runner: ModelRunner | None = None, step_fit: StepFit | None = None,
                 ) -> Engine:
    """An Engine over a ModelRunner for `loaded` (the runner is `engine.executor`);
    `step_fit`: the start-up fit (`fit_to_runner`): its law sizes the steps, and the
    budgets it chose may grow with a step (engine/scheduling/goodput.py)."""
    if runner is None:
        runner = ModelRunner(loaded, config.static.num_kv_blocks, config.static.block_size,
                             config.static.kv_cache_dtype)
    if step_fit is None:
        return Engine(config, runner, eos_token_id=loaded.eos_token_ids)
    engine = Engine(config, runner, eos_token_id=loaded.eos_token_ids, step_law=step_fit.law,
                    growable_budgets=tuple(step_fit.fitted))
    threads = torch.get_num_threads()
    # (with a law only: the governor reads each step's cost relative to the law's price)
    if torch.device(runner.device).type == "cpu" and threads > 1:
        engine.thread_governor = ThreadGovernor(threads, torch.set_num_threads)
    return engine


def fit_to_runner(config: EngineConfig, explicit: set[str], runner: ModelRunner,
                  ) -> tuple[EngineConfig, StepFit | None]:
    """Fit the step budgets `explicit` does not name to steps measured on `runner` (see
    engine/calibration/budget_fit.py); its KV pool is left zeroed, as allocated."""
    if not needs_fit(config, explicit):
        return config, None
    probe = RunnerProbe(runner)
    try:
        return fit_step_budgets(config, explicit, probe)
    finally:
        probe.clear()


def _fit_live_to_static(live: LiveConfig, static: StaticConfig, explicit: set[str],
                        ) -> LiveConfig:
    """Cap defaults that do not fit a small model or KV pool; explicit values stay as given
    (and are validated)."""
    changes: dict[str, Any] = {}
    if "max_num_seqs" not in explicit:
        changes["max_num_seqs"] = min(live.max_num_seqs, static.num_kv_blocks)
    if "prefill_chunk_size" not in explicit:
        changes["prefill_chunk_size"] = min(live.prefill_chunk_size, static.max_model_len)
    if "long_context_threshold" not in explicit:
        changes["long_context_threshold"] = min(live.long_context_threshold,
                                                static.max_model_len)
    return live.replace(**changes) if changes else live
