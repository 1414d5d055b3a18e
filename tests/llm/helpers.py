"""Shared pieces for the LLM tests: prompts of mixed lengths and a plain greedy loop."""

from __future__ import annotations

import inspect

import torch

PROMPTS = [
    "The scheduler",
    "A request waits in its lane queue until the budget allows it to run.",
    "Hello",
    "Each block of the key value cache holds sixteen tokens of one sequence. When the cache"
    " is almost full, the scheduler preempts a request",
    "The quick brown fox",
    "Numbers like 1, 2, 3",
    "She sells sea shells by the sea shore",
    "Operators change the token budget while traffic flows and see the effect",
    "Small models answer short questions",
    "When the cache is almost full",
    "How are you today?",
    "Hello world! How are you today? I am fine, thank you, and you? The quick brown fox"
    " jumps over the lazy dog near the river bank at noon.",
    "Each block",
    "The history of",
    "Logs, traces and dashboards",
    "Preempt and recompute",
]


def greedy_reference(hf_model, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """transformers' own greedy decode with its own KV cache (none of our code: the prompt
    once, then one token a step), argmax, never stopping (= ignore_eos). It gives the same
    tokens as recomputing the whole sequence each step (checked on SmolLM2's PROMPTS), in
    ~60% of the time: the parity tests' largest cost in make test."""
    from transformers import DynamicCache

    # the model fills the cache in place; its argument's name moved (past_key_values ->
    # cache) within the transformers versions pyproject.toml allows
    name = "cache" if "cache" in inspect.signature(hf_model.forward).parameters \
        else "past_key_values"
    ids, step, cache = list(prompt_ids), torch.tensor([prompt_ids]), DynamicCache()
    with torch.inference_mode():
        for _ in range(num_tokens):
            logits = hf_model(input_ids=step, use_cache=True, logits_to_keep=1,
                              **{name: cache}).logits
            ids.append(int(torch.argmax(logits[0, -1].float())))
            step = torch.tensor([[ids[-1]]])
    return ids[len(prompt_ids):]
