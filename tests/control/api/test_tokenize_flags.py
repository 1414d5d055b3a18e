"""/tokenize passes add_special_tokens to the tokenizer as sent (default true, as vLLM), and
/detokenize keeps special tokens in its text. A fake tokenizer: the tests' tiny model adds
no BOS, so on it neither flag changes anything a live test could see."""

from __future__ import annotations

from types import SimpleNamespace

from control.api.vllm_routes import _decode, _encode
from control.api.vllm_schemas import TokenizeCompletionRequest


def test_tokenize_passes_add_special_tokens_and_detokenize_keeps_special_tokens():
    seen = []

    def encode(text, add_special_tokens):
        seen.append(add_special_tokens)
        return [1, 2]

    def decode(ids, skip_special_tokens=False):
        return "hi" if skip_special_tokens else "<s>hi"

    parts = SimpleNamespace(frontend_tokenizer=SimpleNamespace(encode=encode, decode=decode),
                            vocab_size=10)
    for flag in (True, False):
        body = TokenizeCompletionRequest(prompt="hi", add_special_tokens=flag)
        assert _encode(parts, body) == ([1, 2], None)
    assert _encode(parts, TokenizeCompletionRequest(prompt="hi"))[0] == [1, 2]
    assert seen == [True, False, True]
    assert _decode(parts, [1, 2]) == "<s>hi"
