"""What-if accuracy on the bundled model (issue 20, item 4): predictions against live runs.

A short saturated probe under config A, on a server of its own, measures capacity
(finished requests/s with the scenario's concurrency all queued at once). Then one
`batchpilot serve` (SmolLM2-135M, --trace-db) serves the chat scenario (its 50 requests)
under A, then under each B, one after another: `batchpilot loadtest --compare`, so every
run has the same planned arrivals and lengths and its own prompt texts (the prefix cache
serves no later run), arriving at --load x the capacity; then A again with the requests
arriving --rate-scale times as fast (capacity planning, issue 31). After the server stops,
the what-if reads A's window of the trace and predicts A from it (self), each B, and A at
the faster rate (as the server saw it: the ratio of the two runs' mean arrival gaps, which
the client's pacing and concurrency move off `--rate-scale`); each run's own window is
what happened. The live part
takes ~10 minutes on a shared 2-core CPU.

    A          continuous batching, max_num_seqs 64, chunked prefill 32-token chunks,
               a 128-token budget
    seqs4      max_num_seqs 4              unchunked  chunked prefill off (budget: max_model_len)
    static     static batching             budget64   a 64-token budget

Error: predicted / measured - 1 of the server's TTFT, TPOT, E2E and queue delay, p50 and
p99 (the `requests` table's latencies, what the what-if predicts). Goals: self within 10%
(p50) / 20% (p99) on TTFT, TPOT, E2E; cross-config 20% / 30%; A at the faster rate 15% /
25% on TTFT and E2E; the sign of every predicted change right (a change under 5% either
way counts as none).

    python -m bench.whatif_accuracy [--requests 50] [--load 0.6] [--rate-scale 1.5] [--out DIR]
    python -m bench.whatif_accuracy --out DIR --again   # analyse DIR's recording again
    python -m bench.whatif_accuracy --smoke   # the tests' tiny model, 6 requests, A and seqs4
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.loadtest_goals import ROOT, SCENARIOS, start_server
from control.cli.ctl import Client, build_patch
from control.trace.store import open_read_only
from control.whatif.run import predict
from control.whatif.summary import recorded_summary
from control.whatif.window import read_window
from engine.config import EngineConfig, StaticConfig
from engine.config.patch import apply_patch, live_from_dict

SCENARIO = "chat.yaml"
A = "batching=continuous,max_num_seqs=64,chunked_prefill=true,prefill_chunk_size=32," \
    "max_batched_tokens=128"
B = {"seqs4": "max_num_seqs=4", "unchunked": "chunked_prefill=false,max_batched_tokens={len}",
     "static": "batching=static", "budget64": "max_batched_tokens=64"}
METRICS = [(m, p) for m in ("ttft", "tpot", "e2e", "queue") for p in ("p50", "p99")]
GOALS = {"self": {"p50": 0.10, "p99": 0.20}, "cross": {"p50": 0.20, "p99": 0.30},
         "rate": {"p50": 0.15, "p99": 0.25}}
GOAL_METRICS = {"self": ("ttft", "tpot", "e2e"), "cross": ("ttft", "tpot", "e2e"),
                "rate": ("ttft", "e2e")}
FAST = "A_fast"  # A again, the arrivals --rate-scale times as fast
SIGN_TIE = 0.05  # a relative change smaller than this is "no change"
SMOKE = {"requests": 6, "rate": 20.0, "only": ["seqs4"]}  # no probe: a fixed rate


def settings(spec: str, max_model_len: int) -> str:
    """A's settings with a B's over them (KEY=VALUE,...): every run names every setting
    varied, so the merge patches the load test applies one after another do not add up."""
    merged = dict(a.split("=", 1) for a in A.split(","))
    merged.update(a.split("=", 1) for a in spec.format(len=max_model_len).split(",") if a)
    return ",".join(f"{k}={v}" for k, v in merged.items())


def loadtest(url: str, out: Path, extra: list[str], tokenizer: str | None) -> list[dict]:
    cmd = [sys.executable, "-m", "control.cli.main", "loadtest", "--scenario",
           str(SCENARIOS / SCENARIO), "--url", url, "--json", "--db",
           str(out / "loadtest.duckdb"), *extra]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"loadtest failed ({done.returncode})")
    return json.loads(done.stdout)


def record_runs(args: argparse.Namespace, out: Path, db: str) -> tuple[dict, dict, float]:
    """Probe, then serve A and every B. Returns (the server's config as GET /control/config
    gives it, {name: patch}, the rate the runs arrived at)."""
    rate = args.rate or args.load * probe_capacity(args, out)
    proc, url = start_server(out / "server.log", args.model, "--trace-db", db)
    try:
        served = Client(url, "BATCHPILOT_TOKEN").call("GET", "/control/config")
        specs = specs_of(served, args.only)
        loadtest(url, out, ["--requests", str(args.requests), "--rate", f"{rate:.4f}",
                            *(x for n, spec in specs.items() for x in ("--compare",
                                                                       f"{n}:{spec}"))],
                 args.tokenizer)
        patches = {name: build_patch(spec.split(",")) for name, spec in specs.items()}
        if args.rate_scale:
            run_fast(url, out, args, rate, patches["A"])
            patches[FAST] = patches["A"]
    finally:
        _stop(proc)
    return served, patches, rate


def run_fast(url: str, out: Path, args: argparse.Namespace, rate: float, patch: dict) -> None:
    """A again (its config change noted as the load test notes its own, so `windows` finds
    it), the requests arriving args.rate_scale times as fast."""
    client = Client(url, "BATCHPILOT_TOKEN")
    version = client.call("GET", "/control/config")["version"]
    client.call("PATCH", "/control/config", {"changes": patch, "reason":
                f"loadtest rate x{args.rate_scale:g}: config {FAST}"}, if_match=version)
    loadtest(url, out, ["--requests", str(args.requests), "--rate",
                        f"{rate * args.rate_scale:.4f}"], args.tokenizer)


def specs_of(served: dict, only: list[str]) -> dict[str, str]:
    max_len = served["static"]["max_model_len"]
    return {"A": settings("", max_len)} | {name: settings(B[name], max_len) for name in only}


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)


def probe_capacity(args: argparse.Namespace, out: Path) -> float:
    """Finished requests/s under A with --probe-requests sent at once.
    NOTE: on a server of its own, without a trace: the probe's steps (saturated, minutes
    before A's run on a shared machine) would join A's calibration, and did: fitted with
    them, the law missed A's own steps by 11% (docs/whatif.md, "How accurate")."""
    proc, url = start_server(out / "probe-server.log", args.model)
    try:
        client = Client(url, "BATCHPILOT_TOKEN")
        served = client.call("GET", "/control/config")
        client.call("PATCH", "/control/config", {"changes": build_patch(
            specs_of(served, [])["A"].split(",")), "reason": "whatif_accuracy: probe under A"},
            if_match=served["version"])
        probe = loadtest(url, out, ["--requests", str(args.probe_requests), "--rate", "1000"],
                         args.tokenizer)[0]
    finally:
        _stop(proc)
    print(f"capacity under A: {probe['request_rps']:.3f} req/s (probe of"
          f" {args.probe_requests}); runs at {args.load:g} x that", flush=True)
    return probe["request_rps"]


def windows(db: str, names: list[str]) -> dict[str, tuple[float, float]]:
    """Each config's span in the trace: from the loadtest's change to it to the next."""
    con = open_read_only(db)
    try:
        rows = con.execute("SELECT time, note FROM config_changes WHERE note LIKE"
                           " 'loadtest %: config %' ORDER BY time").fetchall()
        end = con.execute("SELECT max(finished_time) FROM requests").fetchone()[0]
    finally:
        con.close()
    starts = [(t, note.rsplit("config ", 1)[1]) for t, note in rows]
    out = {}
    for i, (t, name) in enumerate(starts):
        out[name] = (t, starts[i + 1][0] if i + 1 < len(starts) else end + 1.0)
    missing = set(names) - set(out)
    if missing:
        raise RuntimeError(f"no config change in the trace for {sorted(missing)}")
    return out


def errors(pred: dict, actual: dict) -> dict[str, float | None]:
    return {f"{m}_{p}": (pred[m][p] / actual[m][p] - 1.0
                         if pred[m][p] is not None and actual[m][p] else None)
            for m, p in METRICS}


def _sign(change: float | None) -> int | None:
    return None if change is None else (0 if abs(change) < SIGN_TIE else 1 if change > 0 else -1)


def signs(pred_a: dict, pred_b: dict, real_a: dict, real_b: dict) -> dict[str, dict]:
    out = {}
    for m, p in METRICS:
        pc = pred_b[m][p] / pred_a[m][p] - 1.0 if pred_a[m][p] and pred_b[m][p] else None
        rc = real_b[m][p] / real_a[m][p] - 1.0 if real_a[m][p] and real_b[m][p] else None
        out[f"{m}_{p}"] = {"predicted": pc, "measured": rc,
                           "right": _sign(pc) == _sign(rc) and pc is not None}
    return out


def analyse(db: str, served: dict, patches: dict) -> dict:
    spans = windows(db, list(patches))
    static = StaticConfig(**served["static"])
    live = apply_patch(live_from_dict(served["config"]), static, patches["A"])
    con = open_read_only(db)
    try:
        wins = {name: read_window(con, *spans[name]) for name in patches}
    finally:
        con.close()
    result = predict(wins["A"], EngineConfig(static, live),
                     {n: p for n, p in patches.items() if n not in ("A", FAST)}, exact=True)
    sums = result["summaries"]
    if FAST in patches:  # A's window, its arrivals as fast as the A_fast run's
        if len(wins[FAST].requests) < 2 or len(wins["A"].requests) < 2:
            raise RuntimeError(f"too few requests in the {FAST} or A window to compare rates")
        k = rate_scale_of(wins["A"], wins[FAST])
        fast = predict(wins["A"], EngineConfig(static, live), {}, exact=True, rate_scale=k)
        sums = {**sums, FAST: fast["summaries"][fast["baseline"]]}
    else:
        k = None
    measured = {name: recorded_summary(w, None) for name, w in wins.items()}
    rows = {"A (self)": errors(sums["predicted"], measured["A"])}
    sign_rows = {}
    for name in patches:
        if name != "A":
            rows[name] = errors(sums[name], measured[name])
            sign_rows[name] = signs(sums["predicted"], sums[name], measured["A"], measured[name])
    return {"errors": rows, "signs": sign_rows, "calibration": result["calibration"],
            "fast_rate_scale": k,
            "warnings": result["warnings"], "notes": result["notes"],
            "requests": {n: len(w.requests) for n, w in wins.items()},
            "measured": {n: {f"{m}_{p}": s[m][p] for m, p in METRICS}
                         for n, s in measured.items()},
            "predicted": {("A" if n == "predicted" else n): {f"{m}_{p}": sums[n][m][p]
                                                             for m, p in METRICS}
                          for n in sums if n != "recorded"}}


def rate_scale_of(recorded, faster) -> float:
    """How many times as fast `faster`'s requests arrived as `recorded`'s: the ratio of
    their mean gaps (the load test's planned arrivals, the same for both)."""
    def mean_gap(window) -> float:
        t = sorted(r.arrival_time for r in window.requests)
        return (t[-1] - t[0]) / max(len(t) - 1, 1)

    return mean_gap(recorded) / mean_gap(faster)


def goals_met(res: dict) -> dict[str, bool]:
    out = {}
    for row, errs in res["errors"].items():
        kind = "rate" if row == FAST else "self" if row.startswith("A") else "cross"
        out[row] = all(errs[f"{m}_{p}"] is not None and abs(errs[f"{m}_{p}"]) <= GOALS[kind][p]
                       for m in GOAL_METRICS[kind] for p in ("p50", "p99"))
    out["signs"] = all(v["right"] for s in res["signs"].values() for v in s.values())
    return out


def table(res: dict) -> str:
    cols = [f"{m} {p}" for m, p in METRICS]
    lines = ["error: predicted / measured - 1 (measured s in brackets)",
             f"{'config':<10} " + " ".join(f"{c:>17}" for c in cols)]
    for row, errs in res["errors"].items():
        name = "A" if row == "A (self)" else row
        cells = []
        for m, p in METRICS:
            e, v = errs[f"{m}_{p}"], res["measured"][name][f"{m}_{p}"]
            cells.append("-" if e is None else f"{e:+.0%} ({v:.3g})")
        lines.append(f"{row:<10} " + " ".join(f"{c:>17}" for c in cells))
    lines += ["", "change vs A: predicted / measured, sign right?"]
    for name, s in res["signs"].items():
        cells = [("-" if v["predicted"] is None or v["measured"] is None else
                  f"{v['predicted']:+.0%}/{v['measured']:+.0%} {'ok' if v['right'] else 'NO'}")
                 for v in s.values()]
        lines.append(f"{name:<10} " + " ".join(f"{c:>17}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50, help="per config (chat: 50)")
    parser.add_argument("--probe-requests", type=int, default=32)
    parser.add_argument("--load", type=float, default=0.6, help="x the capacity under A")
    parser.add_argument("--rate", type=float, help="req/s instead of --load (no probe)")
    parser.add_argument("--only", nargs="+", choices=list(B), default=list(B))
    parser.add_argument("--rate-scale", type=float, default=1.5,
                        help="then A with the arrivals this many times as fast (0: not)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", help="keep the trace, logs and recording.json here")
    parser.add_argument("--again", action="store_true",
                        help="analyse the recording in --out again, running nothing live")
    parser.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    args = parser.parse_args()
    args.tokenizer = args.model if Path(args.model).is_dir() else None  # a checkpoint
    with tempfile.TemporaryDirectory(prefix="bench-whatif-acc-") as tmp:
        if args.smoke:
            from bench.random_models import tiny_checkpoint

            vars(args).update(SMOKE)
            args.model = args.tokenizer = str(tiny_checkpoint(Path(tmp) / "model"))
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        db = str(out / "trace.duckdb")
        if args.again:  # what was recorded, analysed again (no load test runs)
            saved = json.loads((out / "recording.json").read_text())
            served, patches, rate = saved["served"], saved["patches"], saved["rate"]
        else:
            served, patches, rate = record_runs(args, out, db)
            (out / "recording.json").write_text(json.dumps(
                {"served": served, "patches": patches, "rate": rate}))
        res = analyse(db, served, patches)
    print(table(res))
    for w in res["warnings"]:
        print(f"WARNING: {w}")
    res.update(bench="whatif_accuracy", smoke=args.smoke, rate_rps=rate,
               requests_per_config=args.requests, scenario=SCENARIO, goals=goals_met(res),
               patches=patches)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
