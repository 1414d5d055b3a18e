"""What-if speed on a synthetic day (issue 20, item 5; goals: a day under 60 s, an hour
under 5 s, for one proposed config).

The trace is the one bench/dashboard_load.py builds (a day at 10 steps/s: 864,000 steps,
172,800 requests, a request every 0.5 s, 64 output tokens each, prompts 100-999 tokens;
no step_requests rows, so the decode context feature is 0). The what-if runs as
`batchpilot whatif --db` does: read the window, fit the step-time law, replay the recorded
config and one proposal (prefill_chunk_size=128: five chunks for a long prompt), summarise.
The two replays run one after the other (`--workers 2`: side by side in two processes,
`batchpilot whatif --jobs 2`; on a loaded machine that gains nothing). Each phase is timed; the
figure is the median of --repeats runs (a shared machine: the spread is printed).

    python -m bench.whatif_speed [--db /tmp/batchpilot-day.duckdb] [--repeats 3]
    python -m bench.whatif_speed --smoke   # an hour at 1 step/s, one run of each window
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import duckdb

from bench.dashboard_load import DAY_S, T0, build
from control.whatif.calibrate import calibrate
from control.whatif.compare import compare
from control.whatif.configs import recorded_config
from control.whatif.window import read_window
from engine.config import EngineConfig

PROPOSAL = {"prefill_chunk_size": 128}
GOALS_S = {"hour": 5.0, "day": 60.0}


def timed_whatif(db: str, since: float | None, until: float | None, workers: int) -> dict:
    """One what-if over [since, until] with PROPOSAL: seconds per phase, and sizes."""
    t0 = time.perf_counter()
    con = duckdb.connect(db, read_only=True)
    try:
        window = read_window(con, since, until)
    finally:
        con.close()
    t1 = time.perf_counter()
    model = calibrate(window.samples)
    t2 = time.perf_counter()
    recorded, _ = recorded_config(window, EngineConfig())
    result = compare(window, model, recorded, {"proposed": PROPOSAL}, workers=workers)
    t3 = time.perf_counter()
    replays = result["replays"]
    return {"read_s": t1 - t0, "fit_s": t2 - t1, "replays_and_summary_s": t3 - t2,
            "replay_wall_s": {k: v["wall_s"] for k, v in replays.items()},
            "total_s": t3 - t0, "requests": len(window.requests),
            "calibration_steps": int(len(window.samples.y)),
            "replay_steps": {k: v["steps"] for k, v in replays.items()}, "workers": workers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default="/tmp/batchpilot-day.duckdb",
                        help="the synthetic day (built here if missing)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="processes for the replays")
    parser.add_argument("--smoke", action="store_true", help="an hour at 1 step/s, 1 run")
    args = parser.parse_args()
    windows = {"hour": (T0 + 5 * 3600, T0 + 6 * 3600), "day": (None, None)}
    with tempfile.TemporaryDirectory(prefix="bench-whatif-speed-") as tmp:
        if args.smoke:
            args.db, args.repeats = f"{tmp}/hour.duckdb", 1
            windows = {"hour": (None, None)}
            build(args.db, 1.0, 3600)
        elif not os.path.exists(args.db):
            t = time.perf_counter()
            build(args.db, 10.0, DAY_S)
            print(f"built {args.db} in {time.perf_counter() - t:.1f} s", flush=True)
        out: dict = {"bench": "whatif_speed", "smoke": args.smoke, "proposal": PROPOSAL,
                     "note": "median of repeats on a shared 2-core machine", "windows": {}}
        for name, (since, until) in windows.items():
            runs = [timed_whatif(args.db, since, until, args.workers)
                    for _ in range(args.repeats)]
            totals = [r["total_s"] for r in runs]
            median = {k: statistics.median(r[k] for r in runs)
                      for k in ("read_s", "fit_s", "replays_and_summary_s", "total_s")}
            last = runs[-1]
            out["windows"][name] = {**median, "totals_s": totals, "requests": last["requests"],
                                    "replay_steps": last["replay_steps"],
                                    "replay_wall_s": last["replay_wall_s"],
                                    "calibration_steps": last["calibration_steps"],
                                    "workers": last["workers"],
                                    "goal_s": GOALS_S[name],
                                    "goal_met": median["total_s"] < GOALS_S[name]}
            print(f"{name}: {last['requests']} requests, {last['replay_steps']} steps;"
                  f" read {median['read_s']:.2f} s, fit {median['fit_s']:.2f} s"
                  f" ({last['calibration_steps']} steps), replays + summary"
                  f" {median['replays_and_summary_s']:.2f} s ({last['workers']} process(es));"
                  f" total {median['total_s']:.2f} s (runs: "
                  f"{', '.join(f'{t:.2f}' for t in totals)}; goal < {GOALS_S[name]:g} s)",
                  flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
