"""How well the start-up step law prices steps of decodes alone: the law fitted as a server
fits it, and the same probes fitted as one law for both kinds of step (before the decode
terms), against decode steps measured on the model runner.

    python -m bench.step_law_fit             # smollm2-135m, 1-48 decodes at contexts 64, 256
    python -m bench.step_law_fit --smoke     # the tests' tiny model, 3 shapes, 2 rounds

`LLM(model, target_step_ms=250)` runs the start-up probe and fits the law
(engine/calibration/step_law.py); the one-law fit reuses those probes with every decode
counted as a prompt token. Then each shape (decodes x context) runs as a real decode step
through `RunnerProbe.decodes`, `--rounds` times, each round cycling through every shape so
the weights come from memory as they do in serving. Printed: per shape the median measured
time, each law's prediction and measured / predicted; and each law's range of that ratio
over the shapes. A range near 1 means the drift reading (measured / predicted against the
server's first steps) does not move when the number of running requests does.
"""

from __future__ import annotations

import argparse
import statistics

from bench.random_models import model_bench_parser, run_bench
from engine import LLM
from engine.calibration.probe import RunnerProbe
from engine.calibration.step_law import StepLaw, StepProbe, fit_law

SMOKE = {"decodes": "1,4,16", "contexts": "32", "rounds": 2}


def one_law(probes: list[StepProbe]) -> StepLaw:
    """The probes fitted as one law for both kinds of step (decodes as prompt tokens)."""
    return fit_law([StepProbe(p.tokens, 0, p.prefill_pairs, p.decode_context, p.seconds,
                              p.label) for p in probes])


def measure(model: str, args: argparse.Namespace) -> dict:
    llm = LLM(model, target_step_ms=250)
    laws = {"own_terms": llm.engine.startup_law, "one_law": one_law(list(llm.step_fit.probes))}
    probe = RunnerProbe(llm.runner)
    shapes = [(b, c) for c in map(int, args.contexts.split(","))
              for b in map(int, args.decodes.split(","))]
    times: dict[tuple[int, int], list[float]] = {s: [] for s in shapes}
    try:
        for shape in shapes:  # warm-up: first calls of a shape build its buffers
            probe.decodes(*shape)
        for _ in range(args.rounds):
            for shape in shapes:
                times[shape].append(probe.decodes(*shape))
    finally:
        probe.clear()
    rows = []
    for b, c in shapes:
        ms = 1000 * statistics.median(times[(b, c)])
        row = {"decodes": b, "context": c, "measured_ms": round(ms, 3)}
        for name, law in laws.items():
            predicted = 1000 * law.step_s(b, b, 0, b * c)
            row[f"{name}_ms"] = round(predicted, 3)
            row[f"{name}_ratio"] = round(ms / predicted, 3)
        rows.append(row)
    ranges = {name: [min(r[f"{name}_ratio"] for r in rows), max(r[f"{name}_ratio"] for r in rows)]
              for name in laws}
    _print_table(rows, ranges)
    return {"laws": {name: law.to_dict() for name, law in laws.items()}, "shapes": rows,
            "ratio_range": ranges}


def _print_table(rows: list[dict], ranges: dict[str, list[float]]) -> None:
    print("| decodes x context | measured ms | one law ms | ratio | own terms ms | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['decodes']} x {r['context']} | {r['measured_ms']:.1f} |"
              f" {r['one_law_ms']:.1f} | {r['one_law_ratio']:.2f} | {r['own_terms_ms']:.1f} |"
              f" {r['own_terms_ratio']:.2f} |")
    print(f"measured / predicted over the shapes: one law {ranges['one_law']}, own terms"
          f" {ranges['own_terms']}")


def main() -> None:
    ap = model_bench_parser(__doc__, SMOKE)
    ap.add_argument("--decodes", default="1,2,4,8,16,32,48", help="decodes a step, listed")
    ap.add_argument("--contexts", default="64,256", help="tokens of context a decode, listed")
    ap.add_argument("--rounds", type=int, default=5)
    run_bench("step_law_fit", ap.parse_args(), SMOKE, measure)


if __name__ == "__main__":
    main()
