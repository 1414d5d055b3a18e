"""Row questions over a fleet: ask each replica, label its rows, merge them as one trace
would have answered.

A list of rows (the slowest requests, steps in a window, config changes, ...) is merged
exactly from each replica's own answer: the fleet's top N by a key is within the union of
each replica's top N, so ask each for N, sort the union by the question's order and keep N.
Every row gains `replica`. A request's timeline comes from the replica that ran it.
Aggregates (summary, latency, series, facts) are not merged here: they run over the union
of the replicas' tables (fleet_db.py), so percentiles are the fleet's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from control.trace.queries import MAX_ROWS

Answers = Sequence[tuple[str, Any]]  # [(replica, that replica's answer)]


def _labelled(answers: Answers) -> list[dict[str, Any]]:
    return [{**row, "replica": replica} for replica, rows in answers for row in rows or ()]


def _desc_nulls_last(key: str) -> Callable[[dict[str, Any]], tuple[bool, float]]:
    return lambda row: (row[key] is None, -(row[key] or 0.0))


def _slow(answers: Answers, params: dict[str, Any]) -> list[dict[str, Any]]:
    rows = sorted(_labelled(answers), key=_desc_nulls_last(params.get("by") or "e2e_s"))
    return rows[:params.get("limit") or 10]


def _steps(answers: Answers, params: dict[str, Any]) -> list[dict[str, Any]]:
    rows = sorted(_labelled(answers), key=lambda r: (r["start_time"], r["replica"]))
    return rows[:params.get("limit") or 1000]


def _steps_around(answers: Answers, params: dict[str, Any]) -> list[dict[str, Any]]:
    at = params["at"]
    before = 5 if params.get("before") is None else params["before"]
    after = 5 if params.get("after") is None else params["after"]
    rows = sorted(_labelled(answers), key=lambda r: (r["start_time"], r["replica"]))
    earlier = [r for r in rows if r["start_time"] <= at]
    later = [r for r in rows if r["start_time"] > at]
    return (earlier[-before:] if before else []) + later[:after]


def _request(answers: Answers, params: dict[str, Any]) -> dict[str, Any] | None:
    """The timeline from the replica that finished the request last (a client may reuse an
    id; one server's trace answers its latest record too)."""
    found = [{**timeline, "replica": replica} for replica, timeline in answers if timeline]
    if not found:
        return None
    return max(found, key=lambda t: ((t.get("request") or {}).get("finished_time") or 0.0))


def _by_time(answers: Answers, params: dict[str, Any]) -> list[dict[str, Any]]:
    rows = sorted(_labelled(answers), key=lambda r: (r["time"], r.get("version") or 0,
                                                     r["replica"]))
    return rows[:MAX_ROWS]


def _loadtest_runs(answers: Answers, params: dict[str, Any]) -> list[dict[str, Any]]:
    rows = sorted(_labelled(answers), key=lambda r: str(r.get("label")))
    rows.sort(key=lambda r: r.get("started") or 0.0, reverse=True)
    return rows[:max(1, min(int(params.get("limit") or 100), 1000))]


ROW_QUESTIONS: dict[str, Callable[[Answers, dict[str, Any]], Any]] = {
    "slow": _slow, "steps": _steps, "steps_around": _steps_around, "request": _request,
    "config_changes": _by_time, "kv_crossings": _by_time, "loadtest_runs": _loadtest_runs,
}


def merge(question: str, params: dict[str, Any], answers: Answers) -> Any:
    """Each replica's answer to a row question -> the fleet's, rows labelled `replica`."""
    return ROW_QUESTIONS[question](answers, params)


def label_runs(con: Any, answer: Any) -> Any:
    """An aggregate's lists of runs and config changes (summary) name their replica."""
    if not isinstance(answer, dict):
        return answer
    replicas = dict(con.execute("SELECT run_id, replica FROM runs").fetchall())
    for run in answer.get("runs") or ():
        run["replica"] = replicas.get(run.get("run_id"))
    return answer
