"""Everything the checks read, gathered once into plain data: the live server's config,
history and /metrics (when there is a server to ask), the trace's facts and config
changes, load-test results, and the repository's Grafana files.

    ev = gather_evidence(UrlSource(url), ControlClient(url), repo_root=".")
    ev = gather_evidence(FileSource("trace.duckdb"))      # a postmortem: no live config

`Evidence` can also be built by hand (tests, the dashboard): every field has a default
meaning "not available", and `missing` says why something is not there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control.checklist.client import ControlClient, Unavailable
from control.checklist.result import ChecklistError
from control.checklist.trace_config import config_from_trace
from control.trace.sources import QUESTIONS, FileSource, TraceError, UrlSource

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Evidence:
    config: dict[str, Any] | None = None  # live config as GET /control/config's "config"
    static: dict[str, Any] | None = None  # block_size, num_kv_blocks, max_model_len, ...
    config_from: str = ""  # where config/static came from (partial in file mode)
    history: list[dict[str, Any]] | None = None  # GET /control/history's versions
    config_changes: list[dict[str, Any]] | None = None  # the trace's config_changes rows
    metrics_text: str | None = None  # GET /metrics
    trace_available: bool = False
    trace_from: str = ""  # the trace that was read
    trace_facts: dict[str, Any] | None = None  # control.trace.facts.checklist_facts
    loadtest_runs: list[dict[str, Any]] = field(default_factory=list)  # summary: a dict
    loadtest_stats: list[dict[str, Any]] = field(default_factory=list)  # facts.loadtest_stats
    loadtest_from: str = ""
    repo_root: Path = REPO_ROOT  # where grafana/ is looked for
    missing: dict[str, str] = field(default_factory=dict)  # kind -> why it is not here


class LoadtestFile:
    """A DuckDB file of load-test results (`batchpilot loadtest --db FILE`): no trace."""

    def __init__(self, path: str):
        self.path = path

    def ask(self, question: str, **params: Any) -> Any:
        import duckdb

        if not os.path.isfile(self.path):
            raise ChecklistError(f"load-test DB {self.path!r} does not exist")
        try:
            con = duckdb.connect(self.path, read_only=True)
        except duckdb.Error as exc:
            raise ChecklistError(f"load-test DB {self.path!r} cannot be opened: {exc}") from None
        try:
            data = QUESTIONS[question][0](con, **params)
        finally:
            con.close()
        return json.loads(json.dumps(data, default=str))


def gather_evidence(source: FileSource | UrlSource | None, control: ControlClient | None = None,
                    repo_root: str | Path = REPO_ROOT, *, spec: Any = None,
                    long_prompt_tokens: int = 512, loadtest_source: Any = None) -> Evidence:
    """Read every piece of evidence once. Raises ChecklistError (exit 2) when the server
    cannot be reached, a token is refused, or a file cannot be opened; evidence that is
    simply not there (metrics off, no trace, no load test) is noted in `missing`.

    `spec` (or `long_prompt_tokens`) sets what counts as a long prompt in the load-test
    stats; `loadtest_source`: a LoadtestFile of results stored outside the trace."""
    if spec is not None:
        long_prompt_tokens = spec.param("long_prompts_dont_stall_decode", "long_prompt_tokens",
                                        long_prompt_tokens)
    ev = Evidence(repo_root=Path(repo_root).resolve())
    if control is not None:
        _gather_live(ev, control)
    else:
        ev.missing["metrics"] = "no server to ask (--url): /metrics not read"
    _gather_trace(ev, source)
    _gather_loadtests(ev, [s for s in (loadtest_source, source if ev.trace_available
                                       else None) if s is not None], long_prompt_tokens)
    if ev.config is None:
        if ev.trace_facts is not None:
            ev.config, ev.static, ev.config_from = config_from_trace(
                ev.trace_facts, ev.config_changes or [])
        ev.missing.setdefault("config", "no live config: no server was asked (--url)")
    return ev


def _gather_live(ev: Evidence, control: ControlClient) -> None:
    try:
        ev.metrics_text = control.get_text("/metrics")
    except Unavailable as exc:
        ev.missing["metrics"] = str(exc)
    try:
        data = control.get_json("/control/config")
        ev.config, ev.static = data["config"], data["static"]
        ev.config_from = f"GET /control/config, version {data['version']}"
    except Unavailable as exc:
        ev.missing["config"] = str(exc)
    try:
        ev.history = control.get_json("/control/history")["versions"]
    except Unavailable as exc:
        ev.missing["history"] = str(exc)


def _ask(source: Any, question: str, **params: Any) -> Any:
    """source.ask, with a failure to reach or open it as ChecklistError."""
    try:
        return source.ask(question, **params)
    except TraceError as exc:
        answered = str(exc).startswith("the server answered")
        if isinstance(source, UrlSource) and answered:
            raise Unavailable(str(exc)) from None
        raise ChecklistError(str(exc)) from None


def _gather_trace(ev: Evidence, source: Any) -> None:
    if source is None:
        ev.missing["trace"] = "no trace given (--url or --trace-db)"
        return
    try:
        ev.trace_facts = _ask(source, "checklist_facts")
        ev.config_changes = _ask(source, "config_changes")
    except Unavailable as exc:
        ev.missing["trace"] = str(exc)
        return
    ev.trace_available = True
    ev.trace_from = (f"trace file {source.path}" if isinstance(source, FileSource)
                     else f"the trace of {source.url}")


def _gather_loadtests(ev: Evidence, sources: list[Any], long_prompt_tokens: int) -> None:
    if not sources:
        ev.missing["loadtest"] = ("no load-test results to read: " + ev.missing.get(
            "trace", "no trace") + "; or pass --loadtest-db FILE")
        return
    seen: set[tuple[str, str]] = set()
    for source in sources:
        try:
            runs = _ask(source, "loadtest_runs")
            stats = _ask(source, "loadtest_stats", long_prompt_tokens=long_prompt_tokens)
        except Unavailable as exc:
            ev.missing["loadtest"] = str(exc)
            continue
        for row in runs:
            if (row["run_id"], row["label"]) not in seen:
                seen.add((row["run_id"], row["label"]))
                if isinstance(row.get("summary"), str):
                    row["summary"] = json.loads(row["summary"])
                ev.loadtest_runs.append(row)
        ev.loadtest_stats += stats
        where = getattr(source, "path", None) or getattr(source, "url", "")
        ev.loadtest_from = ", ".join(filter(None, [ev.loadtest_from, str(where)]))
    ev.loadtest_runs.sort(key=lambda r: r.get("started") or 0.0, reverse=True)
    ev.loadtest_stats = _dedupe(ev.loadtest_stats)


def _dedupe(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep: dict[tuple[str, str], dict[str, Any]] = {}
    for row in stats:
        keep.setdefault((row["run_id"], row["label"]), row)
    return sorted(keep.values(), key=lambda r: r.get("first_sent") or 0.0, reverse=True)
