"""Times as operators type them (control/trace/timeparse.py: `--since`, `--until`, `--at`
and the read routes' since/until): each form its docstring and the CLI's help promise,
against a fixed `now`."""

from __future__ import annotations

from datetime import UTC, datetime
from datetime import time as clock

import pytest

from control.trace.timeparse import parse_time

NOW = 1_764_426_120.0  # 2025-11-29 14:22:00 UTC


@pytest.mark.parametrize(("text", "back_s"), [
    ("-30s", 30.0), ("-15m", 900.0), ("-2h", 7200.0), ("-1d", 86400.0),
    ("-1.5h", 5400.0),  # the CLI's own example
    ("-0.5m", 30.0), (" -15m ", 900.0), ("now", 0.0)])
def test_relative_times_count_back_from_now_in_their_unit(text, back_s):
    assert parse_time(text, now=NOW) == NOW - back_s


def test_epoch_seconds_and_iso_8601_are_absolute():
    assert parse_time("1764419400.5", now=NOW) == 1764419400.5
    assert parse_time(1764419400, now=NOW) == 1764419400.0
    assert parse_time("2026-11-29T14:02:00+00:00", now=NOW) == datetime(
        2026, 11, 29, 14, 2, tzinfo=UTC).timestamp()
    # no zone: the machine's local time, like the clock on the wall
    assert parse_time("2026-11-29 14:02", now=NOW) == datetime(2026, 11, 29, 14, 2).timestamp()


def test_a_clock_time_is_today_in_local_time():
    today = datetime.fromtimestamp(NOW).date()
    for text, wall in (("14:02", clock(14, 2)), ("9:05", clock(9, 5)),
                       ("14:02:30", clock(14, 2, 30)), ("00:00:01.5", clock(0, 0, 1, 500000))):
        assert parse_time(text, now=NOW) == datetime.combine(today, wall).timestamp(), text


def test_no_time_is_none_and_a_bad_one_says_what_is_accepted():
    assert parse_time(None) is None
    assert parse_time("") is None  # an empty form field: no bound
    for text in ("yesterday-ish", "-15x", "15m", "25:00", "-1.5.2h"):
        with pytest.raises(ValueError, match=rf"time '{text}' is not understood; use epoch"):
            parse_time(text, now=NOW)
    for value in ("nan", "inf", "-1e400", float("nan"), float("inf")):
        with pytest.raises(ValueError, match="is not a finite number of epoch seconds"):
            parse_time(value, now=NOW)
