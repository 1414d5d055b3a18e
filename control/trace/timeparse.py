"""Times as operators type them: epoch seconds, ISO 8601, a clock time today, or relative.

    1764419400.5   2026-11-29T14:02:00   2026-11-29 14:02   14:02   14:02:30
    now   -15m   -2h   -30s   -1d      (relative to now)

A time without a zone is local time (the machine's), like the clock on the wall.
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_CLOCK = re.compile(r"^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?$")


def parse_time(text: str | float | None, now: float | None = None) -> float | None:
    """Epoch seconds; None for None or ''. Raises ValueError saying what is accepted."""
    if text is None or text == "":
        return None
    if isinstance(text, int | float):
        return _finite(float(text), text)
    value = text.strip()
    now = time.time() if now is None else now
    if value == "now":
        return now
    match = _RELATIVE.match(value)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        return _finite(number, text)
    try:
        if _CLOCK.match(value):
            today = datetime.fromtimestamp(now).date().isoformat()
            wall = value if value.index(":") == 2 else "0" + value  # ISO wants 09:05
            return datetime.fromisoformat(f"{today}T{wall}").timestamp()
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ValueError(
            f"time {text!r} is not understood; use epoch seconds, ISO 8601"
            " (2026-11-29T14:02:00), a clock time today (14:02), or relative (-15m, -2h,"
            " -1d, now)") from None


def _finite(seconds: float, text: object) -> float:
    """nan, inf and 1e400 are no time (a window bounded by one would silently be none)."""
    if not math.isfinite(seconds):
        raise ValueError(f"time {text!r} is not a finite number of epoch seconds")
    return seconds
