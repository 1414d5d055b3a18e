"""Predictions made by the server, kept in its audit trail: each proposal of a `POST
/v1/whatif` becomes a `config_changes` row with source `whatif`, so a later config change
can be matched to the prediction that preceded it (the go-live checklist's
`change_predicted` item) and a postmortem sees what was predicted before a change.

    record_predictions(state.trace, live_engine_config, actor, result)

A row's `change` is the proposal's diff ({key: [old, new]}, as a real change's) from the
recorded config, and from the live config when the server's config changed since the
window began: the change the operator would make next (a window that began under
max_num_seqs=16, now 32: a proposal of 16 changes nothing in the replay, and would change
the live config). Its `version` is the config in force when it was asked (nothing
changes); its `note` the window and the headline ratios. A proposal that changes neither
is not recorded. NOTE: readers that replay `config_changes` as config versions skip this source
(control/trace/audit_sources.py).
"""

from __future__ import annotations

import time
from typing import Any

from control.trace.format import clock_span
from control.whatif.configs import propose
from engine.config import EngineConfig
from engine.config.patch import diff

WHATIF_SOURCE = "whatif"
HEADLINE = ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s")  # the ratios a note carries


def prediction_note(name: str, result: dict[str, Any]) -> str:
    """'what-if proposed over 60 requests (...): ttft_p99_s 1.32x, ...; 1 warning(s)'."""
    window = result["window"]
    ratios = {row["metric"]: row["ratios"].get(name) for row in result["rows"]
              if row["metric"] in HEADLINE}
    shown = ", ".join(f"{metric} {'-' if r is None else f'{r:.2f}x'}"
                      for metric, r in ratios.items())
    return (f"what-if {name!r} over {window['requests']} requests"
            f" ({clock_span(window['since'], window['until'])}), vs predicted: {shown};"
            f" {len(result['warnings'])} warning(s)")


def record_predictions(writer: Any, live: EngineConfig, actor: str, result: dict[str, Any],
                       now: float | None = None) -> int:
    """One audit row per proposal that changes something, of the window's config or of
    `live` (the server's now); -> how many were queued (a full trace queue drops them,
    counted as the writer counts every dropped row)."""
    queued = 0
    for name, config in result["configs"].items():
        change = {**config["diff"], **_live_diff(live, config["patch"])}
        if not change:
            continue
        queued += bool(writer.submit_config_change(
            time.time() if now is None else now, live.live.version, WHATIF_SOURCE, actor,
            change, prediction_note(name, result)))
    return queued


def _live_diff(live: EngineConfig, patch: dict[str, Any]) -> dict[str, list[Any]]:
    """What `patch` would change in `live`; {} where it does not apply to it (a lane the
    window had and the live config no longer has: the replay's own diff stands)."""
    try:
        return diff(live.live, propose(live, patch).live)
    except ValueError:
        return {}
