"""Compile a StructuredOutput into an xgrammar grammar for one model's vocabulary, once per
distinct schema.

One `GrammarCache` per (tokenizer, logits width, stop tokens), found with `cache_for`. Its
xgrammar compiler keeps compiled grammars in an LRU bounded by bytes (CACHE_LIMIT_BYTES), keyed
by the compact schema text, so a schema sent again costs a lookup. Compiling runs on the
caller's thread: a server compile slot (compile_slots.py, bounded in time by the server),
or LLM.generate's caller; never the engine thread, which only matches (constrain.py).
Compiles are not serialized: a schema that compiles for minutes (a few `pattern`s with
nested repeats do) delays no other. Measured on the 2-core dev VM, shared with other jobs
(load 4-6): a 3-property schema compiles in 5-16 ms on SmolLM2's 49152-token vocabulary;
the TokenizerInfo, built once per cache, ~0.2 s.

The grammar's vocabulary is the model's logits width (`vocab_size`, which may exceed the
tokenizer's: padding ids are never allowed), and its stop tokens are the model's EOS ids:
the ones that end a request, so the request ends when, and only when, the JSON is complete.
So every id a grammar allows is < vocab_size (xgrammar drops tokenizer ids and stop ids
past it; the cache refuses stop ids past it), and constrain.py refuses a grammar compiled
for another width than the logits it masks.

NOTE: xgrammar 0.2.9's strings with minLength / maxLength admit raw control characters
(U+0000-U+001F), which no JSON parser accepts (found by tests/llm/test_structured_output.py).
Valid compact JSON never holds one, in a string or outside, so each cache also builds a
token filter, a bitmask of the tokens whose bytes hold none, and-ed into every grammar row.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from engine.request import SamplingParams
from engine.structured.spec import StructuredOutput

CACHE_LIMIT_BYTES = 64 << 20  # compiled grammars kept per model (xgrammar's LRU)
_CONTROL_BYTE = re.compile(rb"[\x00-\x1f]")


@dataclasses.dataclass(frozen=True)
class CompiledFormat:
    """What StructuredOutput.compiled holds: the grammar, and the token filter (int32
    [ceil(V / 32)], xgrammar's bitmask layout: bit t set = token t may appear at all)."""

    grammar: xgr.CompiledGrammar
    token_filter: torch.Tensor
_XGR_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*(Check failed: \(.*?\) is false:\s*)?")


class GrammarCache:
    """Thread-safe compiler of StructuredOutput specs for one model's vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]):
        if not stop_token_ids:
            raise ValueError("response_format needs a model with an EOS token: the grammar"
                             " ends the output with it")
        outside = [t for t in stop_token_ids if not 0 <= t < vocab_size]
        if outside:  # xgrammar drops them silently: a finished JSON could then take no token
            raise ValueError(f"response_format: the model's EOS ids {outside} are outside its"
                             f" {vocab_size} logits, so the grammar could never end")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self._build_lock = threading.Lock()  # the compiler's one-time build, not compiles
        self._compiler: xgr.GrammarCompiler | None = None  # built on first use (~0.2 s)
        self._token_filter: torch.Tensor | None = None  # set before _compiler

    def compile(self, spec: StructuredOutput, field_name: str = "response_format",
                ) -> CompiledFormat:
        """The grammar of `spec`; ValueError naming `field_name` when xgrammar refuses the
        schema (unknown type, bad reference, ...). Any number of threads may compile at
        once: xgrammar's compiler is thread-safe (its cache is a ThreadSafeLRUCache that
        also makes concurrent compiles of one schema share one; vLLM compiles on a pool
        sharing one compiler), so a compile that never ends blocks no other schema's."""
        compiler = self.ensure_compiler()
        try:
            # compact JSON: no free whitespace, so a weak model cannot loop on spaces
            grammar = compiler.compile_json_schema(spec.schema, any_whitespace=False,
                                                   strict_mode=True)
        except RuntimeError as exc:
            raise ValueError(f"{field_name}: the schema is not supported:"
                             f" {_xgrammar_message(exc)}") from None
        return CompiledFormat(grammar, self._token_filter)

    def ensure_compiler(self) -> xgr.GrammarCompiler:
        """The compiler, built on first call (reads the tokenizer's whole vocabulary: call
        it where the tokenizer may be used, e.g. the server's tokenizer thread)."""
        if self._compiler is None:
            with self._build_lock:
                if self._compiler is None:
                    self._build_compiler()
        return self._compiler

    @property
    def cached_bytes(self) -> int:
        """Bytes of compiled grammars held (at most CACHE_LIMIT_BYTES)."""
        return self._compiler.get_cache_size_bytes() if self._compiler is not None else 0

    def bind(self, spec: StructuredOutput, field_name: str = "response_format",
             ) -> StructuredOutput:
        """`spec` with its compiled grammar (itself when already bound)."""
        if spec.compiled is not None:
            return spec
        return dataclasses.replace(spec, compiled=self.compile(spec, field_name))

    def _build_compiler(self) -> None:
        info = xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(self.stop_token_ids))
        # NOTE: one thread per compile: it runs beside the engine thread, which needs the cores
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True,
                                       cache_limit_bytes=CACHE_LIMIT_BYTES)
        # the filter first: a thread that sees _compiler set (without the lock) finds it too
        self._token_filter = _token_filter(info.decoded_vocab, self.vocab_size)
        self._compiler = compiler


_caches: weakref.WeakKeyDictionary[Any, dict[tuple, GrammarCache]] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def cache_for(tokenizer: Any, vocab_size: int,
              eos_token_id: int | tuple[int, ...] | None) -> GrammarCache:
    """The GrammarCache of this tokenizer (kept while the tokenizer lives), logits width
    and EOS id(s) (the engine's `eos_token_id`)."""
    eos = () if eos_token_id is None else (
        (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id))
    key = (vocab_size, eos)
    with _caches_lock:
        per_tokenizer = _caches.setdefault(tokenizer, {})
        if key not in per_tokenizer:
            per_tokenizer[key] = GrammarCache(tokenizer, vocab_size, eos)
        return per_tokenizer[key]


def bind_params(params: SamplingParams, cache_of: Callable[[], GrammarCache], *,
                field_name: str = "response_format") -> SamplingParams:
    """`params` with its structured output compiled (unchanged when it has none or it is
    bound). `cache_of`: returns the model's GrammarCache, called only when needed (a new
    one builds its TokenizerInfo on first compile). Errors name `field_name`."""
    spec = params.structured_output
    if spec is None or spec.compiled is not None:
        return params
    return dataclasses.replace(params, structured_output=cache_of().bind(spec, field_name))


def _token_filter(decoded_vocab: list[bytes], vocab_size: int) -> torch.Tensor:
    """int32 [ceil(V / 32)]: bit t set when token t's bytes hold no control character
    (ids past the tokenizer's vocabulary: clear)."""
    words = (vocab_size + 31) // 32
    bits = np.zeros(words * 32, dtype=np.uint64)
    bits[:len(decoded_vocab)] = [_CONTROL_BYTE.search(b) is None for b in decoded_vocab]
    packed = (bits.reshape(words, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1)
    return torch.from_numpy(packed.astype(np.uint32).view(np.int32))


def _xgrammar_message(exc: Exception) -> str:
    """xgrammar's first error line without its "[time] file.cc:line:" prefix."""
    line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _XGR_PREFIX.sub("", line)
