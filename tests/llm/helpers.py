"""Shared pieces for the LLM tests: prompts of mixed lengths and a plain greedy loop."""

from __future__ import annotations

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
    """transformers' model over the whole sequence each step (no cache: plainly right),
    argmax, never stopping (= ignore_eos)."""
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(num_tokens):
            logits = hf_model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt_ids):]
