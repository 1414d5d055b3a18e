"""Structured output: JSON (any object, or one JSON schema) by grammar-constrained decoding.

    frontend (server's compile slots, or LLM.generate)         engine thread (sampler)
    StructuredOutput spec --GrammarCache.bind--> compiled  ->  per request: a matcher that
    (spec.py: OpenAI / vLLM shapes,               grammar       accepts each output token and
     validated, compact schema)     (grammar.py: xgrammar,      masks the next token's logits
                                     once per distinct schema)  (constrain.py)
                  (compile_slots.py: the server's bounded compile threads)

A request's output follows its grammar token by token: the sampler sets every token the
grammar cannot take next to -inf, for the rows that have a grammar only (a step without one
does nothing more than look). The model's EOS tokens are the grammar's stop tokens: EOS can
be sampled only once the JSON is complete, and once it is complete nothing else can, so
the request ends "stop" with a whole document. A max_tokens (or stop string) cut before
that ends it "length" (or "stop") with the JSON incomplete, as OpenAI's API does.

xgrammar is imported only by grammar.py and constrain.py, and those only when a request
asks for structured output: `import engine` stays as fast as without it.
"""

from __future__ import annotations

from engine.structured.spec import StructuredOutput

__all__ = ["StructuredOutput"]
