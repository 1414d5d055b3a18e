"""Prompts of an exact token length, as real English text for the server's tokenizer.

    maker = PromptMaker(load_tokenizer("smollm2-135m"))
    text, n = maker.make(300, seed=7)      # n == 300 unless the tokenizer made that impossible

The text is a window of the bundled corpus (data/corpus.txt, original prose written for
this project) starting at a seed-dependent word boundary and wrapping around the corpus
end. Decoding a window of ids and encoding the text again need not give the same count
(BPE merges across the window's edges), so `make` grows or shrinks the window until the
count is exact, and moves the start a few words on if that never converges.

Counts are without special tokens: a server that adds a BOS token or a chat template
counts more (`usage.prompt_tokens` in the response says by how many).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Protocol

CORPUS_PATH = Path(__file__).parent / "data" / "corpus.txt"
RESIZE_TRIES = 6  # window resizes per start offset before moving the start
START_TRIES = 4  # start offsets tried (each one word boundary further on)


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class PromptMaker:
    """Texts of a given token count for one tokenizer; the corpus is encoded once."""

    def __init__(self, tokenizer: Tokenizer, corpus: str | None = None) -> None:
        self.tokenizer = tokenizer
        text = corpus if corpus is not None else CORPUS_PATH.read_text(encoding="utf-8")
        self.ids: list[int] = list(tokenizer.encode(text, add_special_tokens=False))
        if not self.ids:
            raise ValueError("the prompt corpus encodes to no tokens")
        starts_word = {i: _starts_word(tokenizer, i) for i in set(self.ids)}
        # indexes into self.ids where a word begins (the token carries its leading space);
        # every index when the tokenizer does not show word starts
        self.word_starts = [k for k, i in enumerate(self.ids) if starts_word[i]]
        if len(self.word_starts) < len(self.ids) // 20:
            self.word_starts = list(range(len(self.ids)))

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def make(self, num_tokens: int, seed: int | str = 0) -> tuple[str, int]:
        """(text, its token count): the count equals num_tokens when the tokenizer allows
        it, otherwise the closest found (a few tokens off at most, in practice)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens={num_tokens} must be >= 0")
        if num_tokens == 0:
            return "", 0
        first = random.Random(seed).randrange(len(self.word_starts))
        best: tuple[str, int] | None = None
        for shift in range(START_TRIES):
            start = self.word_starts[(first + shift) % len(self.word_starts)]
            text, n = self._fit(start, num_tokens)
            if n == num_tokens:
                return text, n
            if best is None or abs(n - num_tokens) < abs(best[1] - num_tokens):
                best = (text, n)
        assert best is not None
        return best

    def _fit(self, start: int, num_tokens: int) -> tuple[str, int]:
        """Resize the window at `start` until its text re-encodes to num_tokens."""
        length, tried = num_tokens, set()
        best: tuple[str, int] | None = None
        for _ in range(RESIZE_TRIES):
            tried.add(length)
            text = self._window(start, length)
            n = self.count(text)
            if best is None or abs(n - num_tokens) < abs(best[1] - num_tokens):
                best = (text, n)
            if n == num_tokens:
                break
            length = max(1, length + num_tokens - n)
            if length in tried:  # oscillating between two lengths: give up on this start
                break
        assert best is not None
        return best

    def _window(self, start: int, length: int) -> str:
        size = len(self.ids)
        ids = [self.ids[(start + k) % size] for k in range(length)]  # wraps at the end
        return self.tokenizer.decode(ids)


def _starts_word(tokenizer: Tokenizer, token_id: int) -> bool:
    """Whether the token begins with whitespace: byte-level BPE decodes it with its space;
    SentencePiece shows a space mark at the start of the token's own string."""
    if tokenizer.decode([token_id])[:1].isspace():
        return True
    to_token = getattr(tokenizer, "convert_ids_to_tokens", None)
    word_marks = ("\u2581", "\u0120")  # SentencePiece's and GPT-2's space marks
    return bool(to_token) and str(to_token(token_id)).startswith(word_marks)


def load_tokenizer(model: str | os.PathLike[str]) -> Any:
    """The tokenizer of a model alias, checkpoint directory or .gguf file, found the way
    engine.models.load_model finds it (resolve_model_source, then the converted-GGUF cache
    when it holds a copy), without loading any weights. A GGUF with no converted copy is
    parsed for its tokenizer (~8 s for SmolLM2-135M on the dev VM)."""
    from transformers import AutoTokenizer  # heavy import, deferred

    from engine.models import gguf_cache
    from engine.models.sources import resolve_model_source

    path = resolve_model_source(model)
    converted = gguf_cache.lookup(path) if path.is_file() else None
    path = converted or path
    kwargs: dict[str, Any] = {"local_files_only": True}  # never a hub download
    if path.is_file():  # .gguf
        directory, kwargs["gguf_file"] = path.parent, path.name
    else:
        directory = path
    return AutoTokenizer.from_pretrained(directory, **kwargs)
