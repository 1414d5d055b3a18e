"""Our paged-cache models against transformers (eager attention, fp32) on tiny checkpoints.

transformers sees each sequence whole, in one causal pass; ours sees it through the paged
cache in chunks, decode steps and mixed batches, with shuffled block ids. Logits at every
position must agree to 1e-4, and so must the greedy token.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.paged import PagedHarness, chunks, hf_logits

from engine.models import load_model

ATOL = 1e-4
PROMPT = "The scheduler picks the running decodes first, then prefill chunks from every lane."
OTHER_PROMPTS = [
    "Hello world! How are you today?",
    "Each block of the key value cache holds sixteen tokens.",
    "Numbers like 42 and 2048 appear in logs.",
]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request):
    directory = request.getfixturevalue(f"tiny_{request.param}_dir")
    return load_model(directory, dtype="float32", keep_reference=True)  # exact parity


def encode(loaded, text: str) -> list[int]:
    return loaded.tokenizer(text)["input_ids"]


def assert_logits_match(ours: torch.Tensor, reference: torch.Tensor) -> None:
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)
    assert torch.equal(ours.argmax(-1), reference.argmax(-1)), "greedy tokens differ"


def test_full_prompt_in_one_pass(tiny):
    ids = encode(tiny, PROMPT)
    assert len(ids) > 12
    ours = PagedHarness(tiny.model, block_size=4, seed=1).step({"a": ids})["a"]
    assert_logits_match(ours, hf_logits(tiny.reference, ids))


def test_chunked_prefill_through_shuffled_blocks(tiny):
    ids = encode(tiny, PROMPT)
    harness = PagedHarness(tiny.model, block_size=4, seed=2)
    # chunk edges fall inside blocks and on their boundaries; one chunk is a single token
    ours = torch.cat([harness.step({"a": c})["a"] for c in chunks(ids, [5, 1, 2, 7])])
    assert harness.blocks["a"] != sorted(harness.blocks["a"])  # ids really are shuffled
    assert_logits_match(ours, hf_logits(tiny.reference, ids))


def test_decode_steps_follow_transformers_greedy(tiny):
    ids = encode(tiny, PROMPT)
    harness = PagedHarness(tiny.model, block_size=4, seed=3)
    for chunk in chunks(ids, [9]):
        logits = harness.step({"a": chunk})["a"]
    tokens = list(ids)
    for _ in range(8):
        tokens.append(int(logits[-1].argmax()))
        logits = harness.step({"a": tokens[-1:]})["a"]
        reference = hf_logits(tiny.reference, tokens)[-1:]
        assert_logits_match(logits, reference)


def test_mixed_batch_of_sequences_at_different_stages(tiny):
    a, b, c, d = (encode(tiny, text) for text in [PROMPT, *OTHER_PROMPTS])
    full = {"a": a + [5, 6], "b": b + [7, 8], "c": c, "d": d}
    harness = PagedHarness(tiny.model, block_size=3, seed=4)
    steps = [
        {"a": a[:8], "b": b},  # a: first chunk; b: whole prompt
        {"a": a[8:], "b": [7], "c": c[:6], "d": d[:1]},  # cached prefix, decode, fresh, 1 token
        {"a": [5], "b": [8], "c": c[6:], "d": d[1:3]},  # decode, decode, last chunk, chunk
        {"a": [6], "d": d[3:]},
    ]
    seen = {name: 0 for name in full}
    for feeds in steps:
        out = harness.step(feeds)
        for name, fed in feeds.items():
            lo = seen[name]
            seen[name] += len(fed)
            reference = hf_logits(tiny.reference, full[name][: seen[name]])[lo:]
            assert_logits_match(out[name], reference)
    assert seen == {name: len(tokens) for name, tokens in full.items()}


def test_loaded_model_fields(tiny):
    tok = tiny.tokenizer
    assert tiny.architecture in ("LlamaForCausalLM", "Qwen2ForCausalLM")
    assert tiny.eos_token_ids == (tok.convert_tokens_to_ids("<|endoftext|>"),)
    assert tiny.max_model_len == 512
    assert tiny.model.num_kv_heads == 2 and tiny.model.head_dim == 16
    tied = tiny.architecture == "LlamaForCausalLM"  # the tiny llama ties, the tiny qwen2 not
    same = tiny.model.lm_head.weight.data_ptr() == tiny.model.model.embed_tokens.weight.data_ptr()
    assert same == tied
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
