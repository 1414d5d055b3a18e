"""Which lane a request belongs to: on arrival, and when a config change removes its lane.

A request that names no lane is routed by `route`: its tenant's lane if the live config
names one (`tenant_lanes`), else prompts of `long_context_threshold` tokens or more to
`long_context_lane`, else `default_lane`. A live config change may remove lanes; the
requests still in one (queued or running) move to the lane `lane_moves` names for it,
and `check_lane_moves` refuses a change that would leave any of them without one, so no
request is dropped by a config change.
"""

from __future__ import annotations

from collections.abc import Collection

from engine.config import LiveConfig, StaticConfig
from engine.request import Request


class LaneNotEmptyError(ValueError):
    """A config change removes a lane that still has requests and names no lane for them."""


def route(live: LiveConfig, num_prompt_tokens: int, tenant: str = "") -> str:
    """The lane for a request that names none: its tenant's lane if the config names
    one, else long prompts to the long-context lane, else the default lane."""
    for name, lane in live.tenant_lanes:
        if name == tenant:
            return lane
    if live.long_context_lane and num_prompt_tokens >= live.long_context_threshold:
        return live.long_context_lane
    return live.default_lane


def check_lane_moves(live: LiveConfig, static: StaticConfig, installed: LiveConfig,
                     requests: Collection[Request], lane_moves: dict[str, str] | None) -> None:
    """Raise ValueError (LaneNotEmptyError) unless `live` may replace `installed` now,
    with `requests` (the unfinished ones) in their lanes."""
    live.validate(static)
    moves = dict(lane_moves or {})
    new_names = set(live.lane_names)
    for name, target in moves.items():
        if target not in new_names:
            raise ValueError(f"lane_moves[{name!r}]={target!r} must be a lane of the new"
                             f" config ({', '.join(live.lane_names)})")
    for name in set(installed.lane_names) - new_names:
        count = sum(1 for r in requests if r.lane == name)
        if count and name not in moves:
            raise LaneNotEmptyError(f"lane {name!r} still has {count} requests; name a"
                                    " lane to move them to, or wait until it drains")
