"""Row questions over a fleet (control/trace/fleet_merge.py): each replica's answer merged
as one server would answer over all their rows, every row naming its replica."""

from __future__ import annotations

from control.trace.fleet_merge import merge


def steps(*starts: float) -> list[dict]:
    return [{"start_time": t, "step_id": i} for i, t in enumerate(starts)]


def test_steps_around_count_a_step_at_the_moment_as_before_it():
    """As one server (queries.steps_around): start_time <= at is before, > at after."""
    answers = [("0", steps(1.0, 2.0, 3.0)), ("1", steps(1.5, 2.0, 2.5))]
    around = merge("steps_around", {"at": 2.0, "before": 2, "after": 2}, answers)
    assert [(r["start_time"], r["replica"]) for r in around] == [
        (2.0, "0"), (2.0, "1"), (2.5, "1"), (3.0, "0")]
    only_before = merge("steps_around", {"at": 2.0, "before": 1, "after": 0}, answers)
    assert [(r["start_time"], r["replica"]) for r in only_before] == [(2.0, "1")]


def test_a_request_id_on_two_replicas_is_the_one_that_finished_last():
    """A client may reuse an id; one server's trace answers its latest record too."""
    def timeline(finished: float) -> dict:
        return {"request": {"request_id": "r1", "finished_time": finished}, "steps": []}

    answers = [("0", timeline(105.0)), ("1", None), ("2", timeline(100.0))]
    assert merge("request", {"request_id": "r1"}, answers)["replica"] == "0"
    answers = [("0", timeline(100.0)), ("1", timeline(105.0))]
    assert merge("request", {"request_id": "r1"}, answers)["replica"] == "1"
    assert merge("request", {"request_id": "r1"}, [("0", None), ("1", None)]) is None


def test_load_test_runs_are_newest_first_and_the_limit_keeps_the_newest():
    answers = [("0", [{"label": "a", "started": 10.0}, {"label": "b", "started": 30.0}]),
               ("1", [{"label": "c", "started": 20.0}, {"label": "d", "started": 40.0}])]
    runs = merge("loadtest_runs", {"limit": 3}, answers)
    assert [(r["label"], r["replica"]) for r in runs] == [("d", "1"), ("b", "0"), ("c", "1")]
