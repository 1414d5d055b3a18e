"""The chart series over a trace (control/trace/series.py) against the rows they bucket:
the latency series counts the requests that have a latency (rejections have none), and
the KV series' max is each bucket's peak, the one a watermark is read against."""

from __future__ import annotations

import pytest
from fixtures.trace_data import fill_trace

from control.trace import series
from control.trace.store import open_read_only


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("series") / "trace.duckdb")
    fill_trace(path).stop()  # 8 requests and "big", rejected as too long
    con = open_read_only(path)
    yield con
    con.close()


def test_the_latency_series_counts_no_rejected_request(con):
    (rejected,) = con.execute("SELECT count(*) FROM requests WHERE outcome = 'rejected'"
                              ).fetchone()
    (served,) = con.execute("SELECT count(*) FROM requests WHERE outcome <> 'rejected'"
                            ).fetchone()
    assert rejected >= 1 and served > 0
    for by in ("lane", "tenant"):
        rows = series.latency_series(con, buckets=5, by=by)["rows"]
        assert sum(r["requests"] for r in rows) == served, by


def test_the_kv_series_max_is_each_buckets_peak(con):
    got = series.step_series(con, buckets=4)
    bucket_s = got["bucket_s"]
    peaks = dict(con.execute("SELECT floor(start_time / ?) * ?, max(kv_usage) FROM steps"
                             " GROUP BY 1", [bucket_s, bucket_s]).fetchall())
    assert got["rows"] and {r["time"]: r["kv_usage_max"] for r in got["rows"]} == peaks
    assert any(r["kv_usage_max"] > r["kv_usage_mean"] for r in got["rows"])
