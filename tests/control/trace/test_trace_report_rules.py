"""`batchpilot trace report`'s rules (control/trace/report.py) and Markdown
(report_format.py), on hand-made answers of the trace's questions: which requests judge a
change, when a p99 is worse, what a rejection burst is, what the slowest list holds."""

from __future__ import annotations

from typing import Any

import pytest

from control.trace.report import JUDGED, build_report, judge_change, rejection_bursts
from control.trace.report_format import _arrow, _no_cause, _timeline

THRESHOLDS = {"min_requests": 10, "worse_ratio": 1.5, "worse_abs_s": 0.02,
              "judged": list(JUDGED)}


def stats(p99: float, n: int = 50) -> dict[str, Any]:
    return {"ttft_s_n": n, **{m: p99 for m in JUDGED}}


class Cohorts:
    """A source whose cohort_latency answers by window: `before` up to the change at
    `t`, `after` from it; it records the windows asked."""

    def __init__(self, t: float, before: dict[str, Any], after: dict[str, Any]):
        self.t, self.before, self.after, self.asked = t, before, after, []

    def ask(self, question: str, since: float, until: float) -> dict[str, Any]:
        assert question == "cohort_latency"
        self.asked.append((since, until))
        return {"all": self.before if until <= self.t else self.after}


def changes(*times: float) -> list[dict[str, Any]]:
    return [{"version": i + 2, "time": t, "source": "api"} for i, t in enumerate(times)]


def test_a_change_is_judged_by_requests_after_the_previous_change_only():
    source = Cohorts(200.0, stats(0.1), stats(0.1))
    verdict = judge_change(source, changes(100.0, 200.0, 260.0), 1, None, None, 300.0)
    assert verdict["windows"] == [[100.0, 200.0], [200.0, 260.0]]
    assert source.asked == [(100.0, 200.0), (200.0, 260.0)]


def test_too_few_requests_on_either_side_is_no_verdict():
    for before, after in ((50, 5), (5, 50)):
        source = Cohorts(100.0, stats(0.02, before), stats(0.5, after))
        assert judge_change(source, changes(100.0), 0, None, None, 300.0)["verdict"] == \
            "too few requests", (before, after)


def test_a_p99_that_grew_by_less_than_20_ms_is_noise_however_large_the_ratio():
    source = Cohorts(100.0, stats(0.002), stats(0.012))  # 6x, but 10 ms
    assert judge_change(source, changes(100.0), 0, None, None, 300.0)["verdict"] == \
        "no clear change"
    source = Cohorts(100.0, stats(0.002), stats(0.030))  # 15x and 28 ms
    assert judge_change(source, changes(100.0), 0, None, None, 300.0)["verdict"] == "worse"


class Outcomes:
    def __init__(self, rows: list[dict[str, Any]], bucket_s: float = 10.0):
        self.rows, self.bucket_s = rows, bucket_s

    def ask(self, question: str, **_: Any) -> dict[str, Any]:
        assert question == "series_outcomes"
        return {"bucket_s": self.bucket_s, "rows": self.rows}


def rejected(t: float, n: int, reason: str = "kv_full") -> dict[str, Any]:
    return {"time": t, "outcome": "rejected", "reason": reason, "requests": n}


def test_a_bucket_with_exactly_the_threshold_is_a_burst_and_adjacent_ones_merge():
    """Over 120 buckets, 9 rejections: the threshold is BURST_MIN (3). The buckets at
    100 s (3) and 110 s (4) are one burst of 7; 2 at 500 s is none."""
    rows = [rejected(100.0, 2), rejected(100.0, 1, "too_long"), rejected(110.0, 4),
            rejected(500.0, 2), {"time": 100.0, "outcome": "finished", "reason": None,
                                  "requests": 40}]
    got = rejection_bursts(Outcomes(rows), {"steps": {"first": 0.0, "last": 1200.0}},
                           0.0, 1199.0)
    assert got["total"] == 9 and got["threshold"] == 3
    assert got["bursts"] == [{"start": 100.0, "end": 120.0, "rejected": 7,
                              "reasons": {"kv_full": 6, "too_long": 1}}]


class Canned:
    """Every question build_report asks, answered from `answers`."""

    def __init__(self, **answers: Any):
        self.answers = answers

    def ask(self, question: str, **_: Any) -> Any:
        return self.answers[question]


def window_source(slowest: list[dict[str, Any]]) -> Canned:
    return Canned(summary={"steps": {"first": 0.0, "last": 10.0}}, config_changes=[],
                  cohort_latency={"all": None, "lanes": []}, kv_crossings=[],
                  series_outcomes={"bucket_s": 1.0, "rows": []}, slow=slowest)


def test_the_slowest_requests_leave_out_the_rejected():
    rows = [{"request_id": "big", "outcome": "rejected", "e2e_s": 9.0},
            {"request_id": "r1", "outcome": "finished", "e2e_s": 2.0},
            {"request_id": "r2", "outcome": "timeout", "e2e_s": 1.0}]
    got = build_report(window_source(rows))
    assert [r["request_id"] for r in got["slowest"]] == ["r1", "r2"]


def test_a_window_of_one_instant_is_a_report_not_a_usage_error():
    got = build_report(window_source([]), since=5.0, until=5.0)
    assert got["since"] == got["until"] == 5.0 and got["suspect"] is None


def test_a_pipe_in_a_reason_does_not_split_the_timelines_table():
    change = {"time": 100.0, "version": 2, "source": "api", "actor": "ops",
              "note": "a|b", "change": {"max_num_seqs": [64, 8]}, "verdict": "no clear change"}
    text = _timeline({"changes": [change], "judged": 1, "compare_s": 30.0})
    row = text.splitlines()[-1]
    assert "a\\|b" in row
    assert row.replace("\\|", "").count("|") == 8, row  # 7 cells


def test_only_a_startup_row_is_no_config_change():
    startup = {"time": 1.0, "version": 1, "source": "startup", "change": {}}
    said = _no_cause({"changes": [startup], "thresholds": THRESHOLDS})
    assert said.startswith("**No config change in this window**"), said
    api = {**startup, "version": 2, "source": "api"}
    assert "1 change(s)" in _no_cause({"changes": [startup, api], "thresholds": THRESHOLDS})


@pytest.mark.parametrize(("pair", "said"), [
    ([0.02, 0.2], "20.0 ms -> 200.0 ms (x10.0)"),
    ([0.2, 0.05], "200.0 ms -> 50.0 ms (x0.25)"),
    ([None, 0.2], "- -> 200.0 ms")])
def test_a_p99_change_shows_after_over_before(pair, said):
    assert _arrow(pair) == said


def test_a_drain_or_resume_row_is_listed_but_never_judged():
    """Admission paused and reopened (control/admin) is no config version: never a
    suspect, whatever latency did around it."""
    from control.trace.audit_sources import is_config_version

    rows = [{"time": 5.0, "version": 1, "source": source, "actor": "ops", "change": "{}",
             "note": ""} for source in ("drain", "resume")]
    source = window_source([])
    source.answers["config_changes"] = rows
    got = build_report(source)
    assert got["judged"] == 0 and len(got["changes"]) == 2
    assert all("verdict" not in c for c in got["changes"])
    for audit in ("drain", "resume", "whatif", "step_law_refit", "canary_start",
                  "autoscale_scale_up"):
        assert not is_config_version(audit), audit
    for version in ("startup", "api", None):
        assert is_config_version(version), version


def test_too_few_requests_says_how_many_arrived_on_each_side():
    from control.trace.report_format import _effect

    change = {"source": "api", "verdict": "too few requests", "before": {"ttft_s_n": 3},
              "after": {"ttft_s_n": 40}}
    assert _effect(change) == "too few requests to judge (3 before, 40 after)"
