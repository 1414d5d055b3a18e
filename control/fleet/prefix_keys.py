"""A request's prefix-cache block keys, computed at the ingress exactly as its replica will
compute them: the same body validation, chat template and tokenizer (the replica's routes:
control/api/routes.py), the same tenant or cache_salt domain (control/api/request_meta.py,
engine/kv/prefix_hash.py) and the fleet's shared hash key. The KV index (kv_index.py) then
says how many of those blocks each replica holds.

Only the first `max_chars` characters of a prompt are tokenized: a hostile 1 MB prompt
costs the ingress no more than a long ordinary one, and a prefix that long already tells
the replicas apart. The last block before the cut is dropped (the cut may split a token).

A body the replica would refuse (bad JSON, a malformed X-Tenant, a template the messages
break) has no keys: the router places it as it would without them and the replica answers
the 400 in the server's words.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from control.api.request_meta import tenant_of
from control.api.schemas import ChatCompletionRequest, CompletionRequest
from engine.kv.prefix_hash import BlockHasher, digest_key

log = logging.getLogger("batchpilot.fleet")
MAX_CHARS = 32_768  # of a prompt's text, tokenized to find its blocks


@dataclass(frozen=True)
class PrefixSpec:
    """What an ingress needs to hash requests as its replicas do; small and picklable (Ray
    ships it to the ingress process, which loads the tokenizer there). `hash_key`: the
    fleet's secret, also in every replica's ServeSettings.prefix_hash_key."""

    model: str  # alias, checkpoint directory or .gguf file (the replicas' --model)
    hash_key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    max_chars: int = MAX_CHARS

    def build(self) -> RequestKeys:
        from control.loadtest.prompts import load_tokenizer

        return RequestKeys(load_tokenizer(self.model), self.hash_key, self.max_chars)


class RequestKeys:
    """`tokenizer`: the model's (control/loadtest/prompts.py load_tokenizer); `hash_key`:
    the fleet's secret, the replicas' BlockHasher key. Tokenizing runs on one thread of its
    own (a fast tokenizer is not safe to share between threads), off the event loop."""

    def __init__(self, tokenizer: Any, hash_key: bytes, max_chars: int = MAX_CHARS):
        self.tokenizer, self.hash_key, self.max_chars = tokenizer, hash_key, max_chars
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ingress-tokenizer")
        self._hashers: dict[tuple[int, str], BlockHasher] = {}

    async def of(self, path: str, body: dict[str, Any], headers: Mapping[str, str],
                 block_size: int, sharing: str) -> list[int]:
        """The keys of the request's full blocks, in order; [] when it has none."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.keys, path, body, headers,
                                          block_size, sharing)

    def keys(self, path: str, body: dict[str, Any], headers: Mapping[str, str],
             block_size: int, sharing: str) -> list[int]:
        try:
            domain = _domain(body, headers)
            ids, cut = self.token_ids(path, body)
            if cut:  # the last block may hold a token the cut split
                ids = ids[:max(0, len(ids) - block_size)]
            return self._block_keys(ids, domain, block_size, sharing)
        # NOTE: any failure, not a list of the expected ones: a body the replica refuses
        # fails here in ways no list foresees (a model's chat template raising on the
        # roles, a token id past int64 failing the hash's pack), and the ingress must not
        # answer it a 500 where the replica answers a 400 in its own words
        except Exception as exc:
            log.debug("no prefix keys for a %s body: %s", path, type(exc).__name__)
            return []

    def _block_keys(self, ids: list[int], domain: tuple[str, str | None], block_size: int,
                    sharing: str) -> list[int]:
        hasher = self._hasher(block_size, sharing)
        # as BlockManager.allocate_prefix: full blocks before the last prompt token
        blocks = (len(ids) - 1) // block_size
        digest, keys = hasher.root(*domain), []
        for i in range(blocks):
            digest = hasher.block(digest, ids, i)
            keys.append(digest_key(digest))
        return keys

    def token_ids(self, path: str, body: dict[str, Any]) -> tuple[list[int], bool]:
        """(token ids, whether the text was cut at max_chars). Raises ValueError (pydantic's
        ValidationError is one) for a body the route would refuse."""
        if path.endswith("/chat/completions"):
            chat = ChatCompletionRequest.model_validate(body)
            messages = [m.as_template_dict() for m in chat.messages]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
            return self._encode(text, chat.add_special_tokens)
        completion = CompletionRequest.model_validate(body)
        prompt = completion.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # one prompt in a list: the same request
        if isinstance(prompt, str):
            return self._encode(prompt, completion.add_special_tokens)
        if prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt), False
        return [], False  # several prompts: each is its own request on the replica

    def _encode(self, text: str, add_special_tokens: bool) -> tuple[list[int], bool]:
        cut = len(text) > self.max_chars
        ids = self.tokenizer.encode(text[:self.max_chars], add_special_tokens=add_special_tokens)
        return list(ids), cut

    def _hasher(self, block_size: int, sharing: str) -> BlockHasher:
        hasher = self._hashers.get((block_size, sharing))
        if hasher is None:
            hasher = self._hashers[(block_size, sharing)] = BlockHasher(
                block_size, sharing, key=self.hash_key)
        return hasher

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _domain(body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str, str | None]:
    """(tenant, cache_salt) as the replica reads them: the request's cache domain."""
    user = body.get("user")
    tenant = tenant_of(headers, user if isinstance(user, str) else None)
    salt = body.get("cache_salt")
    return tenant, salt if isinstance(salt, str) else None
