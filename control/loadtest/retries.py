"""What a client does with a refusal, modelled on the OpenAI Python SDK's defaults (what a
drop-in client of this server runs): a 408, 409, 429 or 5xx answer is sent again, up to
`retries` times; after the answer's Retry-After when it is a number of seconds in
(0, MAX_RETRY_AFTER_S], else after INITIAL_DELAY_S x 2^n (at most MAX_DELAY_S) less up to
a quarter of jitter. A Retry-After past MAX_RETRY_AFTER_S: no retry (the server said later
than the client waits). The loadtest's runner (`--client-retries`) and the goodput bench's
simulated clients (bench/goodput_policy.py) share this rule.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

SDK_DEFAULT_RETRIES = 2  # openai-python's DEFAULT_MAX_RETRIES
MAX_RETRY_AFTER_S = 120.0  # a longer Retry-After is not waited for
INITIAL_DELAY_S = 0.5
MAX_DELAY_S = 8.0
RETRIED_STATUSES = frozenset({408, 409, 429})  # and every status from 500


@dataclass(frozen=True)
class ClientRetries:
    retries: int = 0  # sends after the first; 0: a refusal is final

    def __post_init__(self) -> None:
        if not 0 <= self.retries <= 10:
            raise ValueError(f"client retries must be 0..10, not {self.retries}")

    def delay_s(self, status: int, retry_after: str | float | None, sent: int,
                rng: random.Random) -> float | None:
        """Seconds to wait before sending again after the `sent`-th send got `status`
        (with header Retry-After `retry_after`), or None: the answer stands."""
        if sent > self.retries or not (status in RETRIED_STATUSES or status >= 500):
            return None
        after = _seconds(retry_after)
        if after is not None:
            if after > MAX_RETRY_AFTER_S:
                return None
            if after > 0:
                return after
        backoff = min(INITIAL_DELAY_S * 2.0 ** (sent - 1), MAX_DELAY_S)
        return backoff * (1.0 - 0.25 * rng.random())


def _seconds(value: str | float | None) -> float | None:
    """A Retry-After in seconds; an HTTP date, a number that is not finite or anything
    else counts as absent (as the SDK reads it)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) else None
