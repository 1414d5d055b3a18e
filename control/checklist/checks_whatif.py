"""Check that the latest planned config change was predicted before it was made.

A prediction the server made (`POST /v1/whatif`: `batchpilot whatif --url`, the
dashboard's Predict and What-if page) is in the trace's `config_changes` as a `whatif` row
whose `change` is the proposal's diff {key: [old, new]} (control/whatif/audit.py). A
config change was predicted when a `whatif` row at most `max_age_s` before it set every
key the change set to the same new value (a prediction of more keys covers it too).
Planned changes: rows whose source (before any `:NAME`) is in `sources`; rollbacks,
startup, drain/resume are not plans.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from control.checklist.evidence import Evidence
from control.checklist.registry import register
from control.checklist.result import Verdict, failed, needs, passed
from control.whatif.audit import WHATIF_SOURCE

HOW = ("predict it first: `batchpilot whatif --url URL --since -1h --set KEY=VALUE` (or the"
       " dashboard's Predict), then `batchpilot ctl set KEY=VALUE`")


def _when(t: float | None) -> str:
    if t is None:
        return "?"
    return datetime.datetime.fromtimestamp(float(t)).isoformat(sep=" ", timespec="seconds")


def _diff(row: dict[str, Any]) -> dict[str, Any]:
    """{key: new value} of a row's change (a JSON string in the trace)."""
    change = row.get("change")
    try:
        change = json.loads(change) if isinstance(change, str) else (change or {})
    except ValueError:
        return {}
    return {key: pair[1] for key, pair in change.items()
            if isinstance(pair, list | tuple) and len(pair) == 2}


def _covers(prediction: dict[str, Any], change: dict[str, Any]) -> bool:
    return bool(change) and all(key in prediction and _same(prediction[key], value)
                                for key, value in change.items())


def _same(a: Any, b: Any) -> bool:
    # NOTE: 64 and 64.0 match: JSON does not keep an integer's type through every hop
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    return float(a) == float(b) if numbers else a == b


def _shown(change: dict[str, Any]) -> str:
    return ", ".join(f"{k} -> {v!r}" for k, v in change.items())


def _predictor(row: dict[str, Any], predictions: list[dict[str, Any]],
               max_age_s: float) -> dict[str, Any] | None:
    """The latest prediction before `row`, within max_age_s, that covers its change."""
    t, change = float(row.get("time") or 0.0), _diff(row)
    fits = [p for p in predictions if t - max_age_s <= float(p.get("time") or 0.0) <= t
            and _covers(_diff(p), change)]
    return max(fits, key=lambda p: p.get("time") or 0.0, default=None)


@register("change_predicted", sources=["api", "profile", "file"], max_age_s=86400.0)
def change_predicted(ev: Evidence, p: dict[str, Any]) -> Verdict:
    if ev.config_changes is None:
        return needs("no trace read: predictions are recorded in the trace's config_changes"
                     f" ({ev.missing.get('trace', 'no trace')})")
    rows = ev.config_changes
    predictions = [r for r in rows if r.get("source") == WHATIF_SOURCE]
    planned = [r for r in rows if str(r.get("source") or "").split(":")[0] in p["sources"]
               and _diff(r)]
    counts = f"{len(predictions)} what-if prediction(s) recorded"
    if not planned:
        return failed(f"no planned config change in the audit log ({len(rows)} entries,"
                      f" {counts}): {HOW}", predictions=len(predictions), planned=0)
    latest = max(planned, key=lambda r: r.get("time") or 0.0)
    change = (f"version {latest.get('version')} ({latest.get('source')}) at"
              f" {_when(latest.get('time'))} by {latest.get('actor') or '?'}:"
              f" {_shown(_diff(latest))}")
    predicted = sum(_predictor(r, predictions, p["max_age_s"]) is not None for r in planned)
    tally = f"{predicted} of {len(planned)} planned change(s) predicted"
    found = _predictor(latest, predictions, p["max_age_s"])
    if found is None:
        return failed(f"{change} was not predicted: no what-if of these values in the"
                      f" {p['max_age_s']:.0f} s before it ({counts}; {tally}); {HOW}",
                      predictions=len(predictions), planned=len(planned), predicted=predicted)
    return passed(f"{change}; predicted at {_when(found.get('time'))} by"
                  f" {found.get('actor') or '?'} ({found.get('note') or 'what-if'});"
                  f" {tally} [trace config_changes]",
                  predictions=len(predictions), planned=len(planned), predicted=predicted)
