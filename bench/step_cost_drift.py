"""A CPU hog started mid-run: how soon the step cost's drift says so, and how the
scheduler's correction of the step law follows (engine/calibration/drift.py).

    python -m bench.step_cost_drift [--model smollm2-135m] [--seconds 90] [--hog-at 30]
                                    [--hog-for S]
    python -m bench.step_cost_drift --smoke     # the tests' tiny model, 10 s, hog 4-7 s

The offline engine with `target_step_ms` (budgets and the step law fitted at start-up, as
a server fits them) serves a steady closed loop: `--concurrency` requests in flight,
prompts of `--prompt-tokens`, answers of exactly `--output-tokens`. At `--hog-at` seconds,
`--hogs` busy processes (a Python loop each, default one per core) start; they stop at the
end, or `--hog-for` seconds later: then the run goes on quiet, and the figures after the
hog say whether the scheduler's law came back (a law refitted on the busy machine once
stayed, and admission refused what the quiet machine served in time). After every step:
the engine's drift reading and law scale, and the step's time and tokens. Printed: the
drift before the hog and late in it, seconds from the hog's start to the first reading
over 1.5 (the alert's threshold; `BatchpilotStepCostDrift` waits 30 s more, a checklist
run reads it at once), and the law scale, step time and tokens per step before and during
the hog (and after it, with `--hog-for`), with the law's price of a 512-token first prompt
chunk. Goal (issue 31): flagged within a minute. On this noisy VM
another tenant can move the figures; the before/after medians are over tens of seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import time

from tqdm import tqdm

from bench.random_models import measure_on_model
from engine import LLM
from engine.calibration.drift import WINDOW_S
from engine.calibration.step_law import chunk_pairs
from engine.sim.workload import forced_params, synthetic_prompt

FLAG_AT = 1.5  # grafana/alerts.yml BatchpilotStepCostDrift and the checklist's max_drift
PROMPT_512 = (512, 0, chunk_pairs(0, 512), 0)  # StepFeatures of a first 512-token chunk
SMOKE = {"seconds": 10.0, "hog_at": 4.0, "hog_for": 3.0, "concurrency": 4,
         "prompt_tokens": 32, "output_tokens": 16}


def hog() -> None:
    """Another tenant on the machine: one core's worth of interpreter work until killed."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def serve(llm: LLM, args: argparse.Namespace) -> list[dict]:
    """One row per step: t (s since start), hog (bool), drift, scale, step_s, tokens."""
    engine, rng = llm.engine, random.Random(0)
    vocab = range(3, llm.loaded.hf_config.vocab_size)
    hogs: list[multiprocessing.Process] = []
    rows, start, n = [], time.monotonic(), 0
    hog_end = args.hog_at + args.hog_for if args.hog_for else float("inf")
    bar = tqdm(total=int(args.seconds), desc="serving", unit="s")
    try:
        while (t := time.monotonic() - start) < args.seconds:
            if not hogs and args.hog_at <= t < hog_end:
                hogs = [multiprocessing.Process(target=hog, daemon=True)
                        for _ in range(args.hogs)]
                for p in hogs:
                    p.start()
            elif hogs and t >= hog_end and hogs[0].is_alive():
                for p in hogs:
                    p.terminate()
            while len(engine.requests) < args.concurrency:
                engine.add_request(f"r{n}", synthetic_prompt(args.prompt_tokens, rng, vocab),
                                   forced_params(args.output_tokens))
                n += 1
            out = engine.step()
            reading = engine.gauges().step_cost
            if out.record is not None and reading is not None:
                law = engine.scheduler.step_law
                rows.append({"t": t, "hog": args.hog_at <= t < hog_end and bool(hogs),
                             "after": t >= hog_end, "drift": reading.drift,
                             "prompt_s": law.step_s(*PROMPT_512) if law else None,
                             "scale": reading.law_scale, "refits": reading.law_refits,
                             "adopted": reading.law_adopted,
                             "step_s": out.record.end_time - out.record.start_time,
                             "tokens": out.record.tokens_used})
            bar.update(int(t) - bar.n)
    finally:
        for p in hogs:
            p.terminate()
        bar.close()
    return rows


def summarize(rows: list[dict], args: argparse.Namespace) -> dict:
    def median(key: str, sel) -> float | None:
        values = [r[key] for r in rows if sel(r) and r[key] is not None]
        return statistics.median(values) if values else None

    before = lambda r: r["t"] < args.hog_at and r["t"] > args.hog_at / 2  # noqa: E731
    hog_s = args.hog_for or args.seconds - args.hog_at
    settle = min(WINDOW_S, hog_s / 2)  # the window (mostly) full
    late = lambda r: r["hog"] and r["t"] > args.hog_at + settle  # noqa: E731
    quiet_from = args.hog_at + hog_s + min(WINDOW_S, (args.seconds - args.hog_at - hog_s) / 2)
    after = lambda r: r["after"] and r["t"] > quiet_from  # noqa: E731
    flagged = next((r["t"] - args.hog_at for r in rows
                    if r["hog"] and r["drift"] is not None and r["drift"] > FLAG_AT), None)
    return {"steps": len(rows), "hog_at_s": args.hog_at, "hogs": args.hogs,
            "drift_before": median("drift", before), "drift_late_in_hog": median("drift", late),
            "seconds_to_flag": flagged,
            "law_scale_before": median("scale", before), "law_scale_late": median("scale", late),
            "step_s_before": median("step_s", before), "step_s_late": median("step_s", late),
            "tokens_before": median("tokens", before), "tokens_late": median("tokens", late),
            "prompt_512_s_before": median("prompt_s", before),
            "prompt_512_s_late": median("prompt_s", late),
            **({"drift_after": median("drift", after), "law_scale_after": median("scale", after),
                "step_s_after": median("step_s", after), "tokens_after": median("tokens", after),
                "prompt_512_s_after": median("prompt_s", after)} if args.hog_for else {}),
            # the online refit (engine/calibration/online_law.py): tried and adopted, by the
            # hog's start and by the end
            "refits_before_hog": _last(rows, lambda r: r["t"] < args.hog_at),
            "refits_at_end": _last(rows, lambda r: True)}


def _last(rows: list[dict], sel) -> list[int] | None:
    chosen = [r for r in rows if sel(r)]
    return [chosen[-1]["refits"], chosen[-1]["adopted"]] if chosen else None


def measure(model: str, args: argparse.Namespace) -> dict:
    llm = LLM(model, target_step_ms=args.target_step_ms)
    return summarize(serve(llm, args), args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--hog-at", type=float, default=30.0)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--hog-for", type=float, default=None, metavar="S",
                    help="stop the hog after S seconds and go on quiet (default: to the end)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--target-step-ms", type=int, default=250)
    ap.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    args = ap.parse_args()
    started = time.perf_counter()
    result = measure_on_model(args, SMOKE, measure)
    late = result["drift_late_in_hog"]
    print(f"drift before the hog {result['drift_before']}, late in it {late};"
          f" flagged (> {FLAG_AT}) {result['seconds_to_flag']} s after the hog started"
          f" (goal: within 60 s); law scale {result['law_scale_before']} ->"
          f" {result['law_scale_late']}; step {result['step_s_before']} ->"
          f" {result['step_s_late']} s, tokens a step {result['tokens_before']} ->"
          f" {result['tokens_late']}; law refits (tried, adopted) by the hog"
          f" {result['refits_before_hog']}, at the end {result['refits_at_end']};"
          f" a 512-token prompt by the law {result['prompt_512_s_before']} ->"
          f" {result['prompt_512_s_late']} s")
    if args.hog_for:
        print(f"after the hog: drift {result['drift_after']}, law scale"
              f" {result['law_scale_after']}, step {result['step_s_after']} s, tokens a step"
              f" {result['tokens_after']}, a 512-token prompt {result['prompt_512_s_after']} s")
    print(json.dumps({"bench": "step_cost_drift", "smoke": args.smoke, **result,
                      "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
