"""PromptMaker with a tokenizer whose decoded text re-encodes to more tokens than the
window it came from (as BPE merges across a window's edges can): the window is resized
until the count is exact."""

from __future__ import annotations

from control.loadtest.prompts import PromptMaker


class _SplittingTokenizer:
    """Words are tokens, one id each; "thecat" (id 0) decodes to two words, so a window
    holding it re-encodes to one token more per copy."""

    words = ["thecat", "the", "cat", "sat", "on", "a", "mat", "and", "then", "slept"]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.words.index(w) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return "".join(" the cat" if i == 0 else " " + self.words[i] for i in ids)


def test_a_window_that_re_encodes_longer_is_shrunk_to_the_asked_length():
    tokenizer = _SplittingTokenizer()
    maker = PromptMaker(tokenizer, corpus="thecat sat on a mat and then slept " * 8)
    for n in (5, 20, 40):
        for seed in range(3):
            text, got = maker.make(n, seed)
            assert got == n == len(tokenizer.encode(text)), (n, seed)
