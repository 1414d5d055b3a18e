"""Dashboard page load time on a day of traces (goal: under 2 s per page).

Builds a synthetic trace file with a day of data at a busy server's rate (10 steps/s:
864,000 steps; a request every 0.5 s: 172,800 requests; KV snapshots every 50 steps;
a config change every hour), then renders each dashboard page over it with streamlit's
AppTest (the page's whole script: queries, frames, charts), window "all" and "1 h".

    python -m bench.dashboard_load [--db /tmp/day.duckdb] [--steps-per-s 10]
    python -m bench.dashboard_load --smoke   # an hour at 1 step/s in a temporary file, each
                                             # page rendered once per window
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import duckdb

from control.trace.schema import create_schema

ROOT = Path(__file__).resolve().parents[1]
DAY_S = 86_400
T0 = 1_790_000_000.0
PAGES = ["views/overview.py", "views/scheduler.py", "views/requests.py", "views/control.py"]


def build(path: str, steps_per_s: float, seconds: int = DAY_S) -> None:
    """`seconds` of a busy server's trace from T0: steps, a request every 0.5 s, KV snapshots
    every 50 steps, a config change every hour."""
    con = duckdb.connect(path)
    create_schema(con)
    n = int(seconds * steps_per_s)
    dt = 1 / steps_per_s
    lanes = "MAP {'interactive': (i % 7)::BIGINT, 'batch': (i % 3)::BIGINT}"
    con.execute(f"""
        INSERT INTO steps SELECT 'day', i, {T0} + i * {dt}, {T0} + i * {dt} + 0.02, 0.02,
            0.001, 0.018, 0.001, i % 2, 8 + i % 5, (i % 2) * 256, 8 + i % 5, 512,
            (i % 2) * 256 + 8 + i % 5, 32, 200 + i % 300, 3800 - i % 300, 50,
            (200 + i % 300) / 4096.0, {lanes}, MAP {{'interactive': (i % 4)::BIGINT}},
            MAP {{'max_num_seqs': (i % 4)::BIGINT}}, MAP {{'interactive': 'max_num_seqs'}},
            MAP {{'interactive': (8 + i % 5)::BIGINT}}, [1, 2, 3], [4], [256], [], [],
            [], [], 1 + (i // {int(3600 * steps_per_s)}), 0, 0, NULL, NULL, 0.25, 'target'
        FROM range({n}) t(i)""")
    con.execute(f"""
        INSERT INTO requests SELECT 'day', 'r' || i, 'm', CASE WHEN i % 5 = 0 THEN 'batch'
            ELSE 'interactive' END, 't' || (i % 4), 0,
            CASE WHEN i % 50 = 0 THEN 'rejected' WHEN i % 40 = 0 THEN 'cancelled'
                 ELSE 'finished' END, 'length', '', 100 + i % 900, 64, 0, 0,
            {T0} + i * 0.5, {T0} + i * 0.5, {T0} + i * 0.5 + 0.1, {T0} + i * 0.5 + 0.3,
            {T0} + i * 0.5 + 3 + (i % 10) * 0.1, NULL, 0.1, 0.3, 0.04, 3 + (i % 10) * 0.1,
            0.2, 2.7, 0, MAP {{'max_num_seqs': 0.1}}, lpad(i::VARCHAR, 32, '0'), NULL, NULL,
            false
        FROM range({seconds * 2}) t(i)""")
    con.execute(f"""
        INSERT INTO kv_snapshots SELECT 'day', i * 50, {T0} + i * 50 * {dt}, 'periodic',
            4096, 300, 3746, 50, 300 / 4096.0, 0.88, 0.95, MAP {{'interactive': 300}},
            MAP {{'t0': 300}} FROM range({n // 50}) t(i)""")
    con.execute(f"""
        INSERT INTO config_changes SELECT 'day', {T0} + i * 3600, i + 2, 'api', 'ops',
            '{{"max_num_seqs": [32, 16]}}', '' FROM range({max(1, seconds // 3600)}) t(i)""")
    con.execute(f"INSERT INTO runs VALUES ('day', {T0}, 'm', 1, '{{}}')")
    con.close()


def render(db: str, page: str, window: str) -> float:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.session_state["bp_db"] = db
    at.run()
    at.switch_page(page)
    if window != "all":
        at.run()
        at.sidebar.selectbox(key="bp_window").set_value(window)
    st.cache_data.clear()  # time the queries, not the cache
    t = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - t
    assert not at.exception, [e.value for e in at.exception]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default="/tmp/batchpilot-day.duckdb")
    parser.add_argument("--steps-per-s", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3, help="renders per page and window")
    parser.add_argument("--smoke", action="store_true", help="an hour at 1 step/s, 1 render")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        seconds = DAY_S
        if args.smoke:
            args.db, args.steps_per_s, args.repeats = f"{tmp}/hour.duckdb", 1.0, 1
            seconds = 3600
        if not os.path.exists(args.db):
            t = time.perf_counter()
            build(args.db, args.steps_per_s, seconds)
            print(f"built {args.db} in {time.perf_counter() - t:.1f} s"
                  f" ({os.path.getsize(args.db) / 1e6:.0f} MB)")
        print(f"page        window   load s (median of {args.repeats}, first render after "
              "cache clear)")
        result = {"bench": "dashboard_load", "smoke": args.smoke, "seconds_of_trace": seconds,
                  "load_s": {}}
        for page in PAGES:
            for window in ("all", "1 h"):
                times = [render(args.db, page, window) for _ in range(args.repeats)]
                result["load_s"][f"{Path(page).stem} {window}"] = statistics.median(times)
                print(f"{Path(page).stem:<11} {window:<8} {statistics.median(times):.2f}"
                      f"  ({', '.join(f'{x:.2f}' for x in times)})", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
