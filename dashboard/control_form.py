"""The Control page's form logic, without Streamlit: which settings the operator changed,
as a JSON merge patch (RFC 7396) for PATCH /control/config. Only changed leaves are sent,
so a form left alone changes nothing and the server's validation words any refusal."""

from __future__ import annotations

import math
from typing import Any

# The live settings the form edits, by group; the rest stay reachable through
# `batchpilot ctl set` (the form is for the budgets an operator turns at 3 a.m.).
BUDGETS = ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk_size",
           "max_waiting_requests", "queue_timeout_ms", "stream_idle_timeout_ms")
WATERMARKS = ("kv_cache_high_watermark", "kv_cache_reject_watermark")
CHOICES = ("chunked_prefill", "schedule_policy", "batching")
LANE_FIELDS = ("weight", "max_running", "max_waiting", "policy", "tenant_fair_share",
               "queue_timeout_ms", "preempt_first", "preempt_to_start", "batching")
# A lane's `slo` mapping as two cells (seconds; empty: the config's default_slo).
LANE_SLO_COLUMNS = {"slo_ttft_s": "ttft_s", "slo_tpot_s": "tpot_s"}
# Predict replays the last window of the trace up to now (seconds); 15 min by default.
PREDICT_WINDOWS_S = {"5 min": 300, "15 min": 900, "1 h": 3600, "6 h": 21600, "24 h": 86400}


def clean(value: Any) -> Any:
    """A table cell back to JSON: NaN/empty -> None, 4.0 -> 4 where the field is whole."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):  # numpy scalar
        value = value.item()
    if value == "":
        return None
    return value


def merge_patch(current: dict[str, Any], edited: dict[str, Any]) -> dict[str, Any]:
    """The smallest merge patch taking `current` to `edited` (both nested dicts); keys of
    `edited` only, so fields the form does not show are never touched."""
    patch: dict[str, Any] = {}
    for key, new in edited.items():
        old = current.get(key)
        if isinstance(new, dict) and isinstance(old, dict):
            sub = merge_patch(old, new)
            if sub:
                patch[key] = sub
        elif not _same(old, new):
            patch[key] = new
    return patch


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return old is new
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return math.isclose(old, new, rel_tol=0, abs_tol=1e-12)
    return old == new


def lane_rows(lanes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Lane settings (as GET /control/config gives them) as the table's rows: the lane's
    SLO targets as LANE_SLO_COLUMNS first (None where it sets none), then LANE_FIELDS."""
    rows = {}
    for name, lane in lanes.items():
        slo = lane.get("slo") or {}
        rows[name] = {**{col: slo.get(key) for col, key in LANE_SLO_COLUMNS.items()},
                      **{f: lane.get(f) for f in LANE_FIELDS}}
    return rows


def _slo_from_row(row: dict[str, Any]) -> dict[str, float] | None:
    """The SLO cells as a lane's `slo` (None: both empty, the default_slo applies)."""
    slo = {key: clean(row.get(col)) for col, key in LANE_SLO_COLUMNS.items()}
    if all(v is None for v in slo.values()):
        return None
    return {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in slo.items()}


def lanes_from_rows(rows: dict[str, dict[str, Any]], current: dict[str, Any]
                    ) -> dict[str, dict[str, Any]]:
    """Edited lane rows (lane -> field -> cell) as lane settings, typed like `current`:
    an integer field stays an integer (the table shows whole numbers as floats); the SLO
    cells become the lane's `slo`."""
    lanes: dict[str, dict[str, Any]] = {}
    for name, row in rows.items():
        before = current.get(name, {})
        lane: dict[str, Any] = {"slo": _slo_from_row(row)}
        for field in LANE_FIELDS:
            value = clean(row.get(field))
            if isinstance(value, float) and value.is_integer() and field != "weight":
                value = int(value)
            if isinstance(before.get(field), float) and isinstance(value, int):
                value = float(value)
            lane[field] = value
        lanes[name] = lane
    return lanes
