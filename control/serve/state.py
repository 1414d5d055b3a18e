"""The server's state on `app.state.serving`: settings, the engine loop, the tokenizer
thread, and the count of generation requests in flight (read by graceful shutdown).

Touched only from the event loop, except `encode_*`, which run on the one tokenizer thread
(tokenizing a long prompt or rendering a chat template must not block the event loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from control.admin.auth import Token
from control.admin.config_store import ConfigStore
from control.api.delivery import DeliveryProbe
from control.api.errors import APIError
from control.metrics.observer import Observer
from control.metrics.registry import ServingMetrics
from control.serve.bootstrap import EngineParts
from control.serve.engine_loop import AsyncEngine
from control.serve.settings import ServeSettings
from control.trace.writer import TraceWriter

T = TypeVar("T")


@dataclass
class ServerState:
    settings: ServeSettings
    engine: AsyncEngine
    metrics: ServingMetrics | None = None
    delivery: DeliveryProbe | None = None  # the way from a step to the client, measured
    observer: Observer | None = None
    trace: TraceWriter | None = None  # None: tracing is off
    config_store: ConfigStore | None = None  # None: the control API is off
    control_tokens: tuple[Token, ...] = ()  # none: the API is open, on loopback only
    config_watcher: Any = None  # a ConfigWatcher while the --config file is watched
    started: int = field(default_factory=lambda: int(time.time()))
    inflight: int = 0  # generation requests admitted and not yet answered
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="tokenizer"))

    @property
    def parts(self) -> EngineParts | None:
        return self.engine.parts

    @property
    def model_names(self) -> set[str]:
        return {self.settings.model_name, self.settings.model}

    def finished_one(self) -> None:
        self.inflight -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def run_tokenizer(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ---- on the tokenizer thread -------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """(text, token ids) of a completions prompt: text, or token ids checked against
        the vocabulary (an id out of range would fail the whole batch's step)."""
        parts = self._parts()
        if isinstance(prompt, str):
            return prompt, parts.frontend_tokenizer.encode(prompt, add_special_tokens=False)
        bad = [t for t in prompt if not 0 <= t < parts.vocab_size]
        if bad:
            raise APIError(400, f"prompt token ids must be in 0..{parts.vocab_size - 1};"
                           f" got {bad[:5]}", code="invalid_value", param="prompt")
        return None, list(prompt)

    def encode_chat(self, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
        tokenizer = self._parts().frontend_tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, "this model has no chat template; use /v1/completions",
                           code="no_chat_template", param="messages")
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
        except Exception as exc:  # the template rejects this conversation (e.g. roles)
            raise APIError(400, f"the chat template rejected the messages: {exc}",
                           code="invalid_value", param="messages") from None
        return text, tokenizer.encode(text, add_special_tokens=False)

    def _parts(self) -> EngineParts:
        if self.engine.parts is None:
            raise APIError(503, "the model is loading", code="loading")
        return self.engine.parts


def get_state(request: Request) -> ServerState:
    return request.app.state.serving
