"""Incremental detokenization and stop strings.

Text is decoded over a short sliding window of token ids: the new text is what the window
decodes to beyond what its already-emitted part decoded to. A token that ends inside a
multi-byte character decodes to U+FFFD; its text waits for the tokens that complete it.
When the output ends first, the final delta shows what is left as it decodes (U+FFFD), so
the text is always the whole decode of the output: nothing sampled is dropped unseen.

Stop strings: the text stops right before the first stop string; while streaming, the
last (longest stop string - 1) characters are held back, since they may begin one.

Each token costs two decodes of the window. A transformers fast tokenizer's `decode` is
its Rust tokenizer's plus Python around it (argument conversion, batch checks, a cleanup
it skips where `clean_up_tokenization_spaces` is off): on SmolLM2's tokenizer 5.7 us a
token in all, 1.9 us through the Rust call alone. Where `backend_decoder` finds that
`decode` is exactly the backend's (the stock TokenizersBackend, no cleanup), the window
goes to the backend directly; any other tokenizer keeps `decode`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

PROMPT_CONTEXT_TOKENS = 5  # prompt tokens kept as context so leading spaces decode right


def backend_decoder(tokenizer) -> Callable[..., str] | None:
    """The Rust tokenizer's decode (ids, skip_special_tokens=) where it returns what
    tokenizer.decode does (a stock transformers fast tokenizer, cleanup off), else None."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: keep its decode
        return None
    kind = type(tokenizer)
    if not (isinstance(tokenizer, TokenizersBackend)
            and kind.decode is PreTrainedTokenizerBase.decode
            and kind._decode is TokenizersBackend._decode
            and not getattr(tokenizer, "clean_up_tokenization_spaces", True)):
        return None
    return tokenizer._tokenizer.decode


@dataclass
class IncrementalDetokenizer:
    tokenizer: object  # a transformers tokenizer
    prompt_token_ids: list[int]
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    text: str = ""  # all output text so far (before any stop string)
    emitted: int = 0  # characters of `text` already handed out
    stopped_on: str | None = None  # the stop string that ended the text
    _ids: list[int] = field(default_factory=list)
    _prefix: int = 0
    _read: int = 0
    _backend: Callable[..., str] | None = None

    def __post_init__(self) -> None:
        self._ids = list(self.prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix, self._read = 0, len(self._ids)
        self._backend = backend_decoder(self.tokenizer)

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_tokens(self, token_ids: list[int]) -> None:
        """Append sampled tokens; updates `text` (and `stopped_on` at a stop string)."""
        for token_id in token_ids:
            if self.stopped_on is not None:
                return
            self._ids.append(token_id)
            before = self._decode(self._ids[self._prefix:self._read])
            after = self._decode(self._ids[self._prefix:])
            if len(after) > len(before) and not after.endswith("\ufffd"):
                self._append(after[len(before):])

    def _append(self, new_text: str) -> None:
        start = len(self.text)
        self.text += new_text
        self._prefix, self._read = self._read, len(self._ids)
        self._check_stop(start)

    def _flush_incomplete(self) -> None:
        """At the end of the output: the tokens still waiting for a character's last bytes
        join the text as they decode (with U+FFFD for the missing bytes)."""
        if self.stopped_on is not None or self._read == len(self._ids):
            return
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) > len(before):
            self._append(after[len(before):])

    def _check_stop(self, new_from: int) -> None:
        if not self.stop:
            return
        longest = max(len(s) for s in self.stop)
        search_from = max(0, new_from - longest + 1)
        hits = [(self.text.find(s, search_from), s) for s in self.stop]
        hits = [(pos, s) for pos, s in hits if pos >= 0]
        if hits:
            pos, s = min(hits)
            self.text = self.text[:pos]
            self.stopped_on = s

    def take_delta(self, final: bool) -> str:
        """Text not yet handed out; holds back a possible stop-string start unless final."""
        if final:
            self._flush_incomplete()
        end = len(self.text)
        if not final and self.stop and self.stopped_on is None:
            end = max(self.emitted, end - (max(len(s) for s in self.stop) - 1))
        delta = self.text[self.emitted:end]
        self.emitted = end
        return delta
