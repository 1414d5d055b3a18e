"""Scheduler CPU time per step, and continuous vs static batching in steps.

Part 1: the engine's own time per step (expire + schedule + update + StepRecord; the
simulated executor's time is taken out) with 1..512 running sequences, lanes, fair share,
watermarks and StepRecords on. "decode" keeps N sequences decoding; "arrivals" keeps N
running while requests finish and new ones arrive and prefill every step.

Part 2: steps to finish the same requests with continuous vs static (request-level)
batching, output lengths from the Azure 2023 conversation trace, 1-token prompts so
steps count decode work only. Theory: static needs sum over batches of the batch's
longest output; continuous at best ceil(sum of outputs / max_num_seqs). The share of
theory is the measured ratio over that ideal ratio.

Part 3: prefix-cache block hashing, µs per full block (hashing happens only when a block
becomes full, and on a first schedule's prefix lookup): the old builtin
`hash((parent, tuple(tokens)))` beside the keyed 128-bit blake2b chain the BlockManager now
uses (engine/kv/prefix_hash.py), A B A B over rounds, each round hashing the same chained
prompt of random token ids; the median over rounds [min-max].

Part 4: KV events (engine/kv/events.py, a fleet's precise routing) off and on, the engine's
time per step with arrivals, A B A B per size; median on/off ratio over rounds.

Last line: one JSON object.

    python -m bench.scheduler_overhead [--sizes 1,16,64,256,512] [--steps 200]
    python -m bench.scheduler_overhead --smoke    # tiny sizes, seconds: checks the script
    python -m bench.scheduler_overhead --against 0237bc9 [--rounds 5]

--against REF: part 1 only, side by side with another commit. REF is checked out in a
temporary `git worktree` (removed at the end); the step-cost driver (bench/step_cost.py,
copied to a temporary folder) runs alternately on this tree (A, with uncommitted changes)
and on REF (B), A B A B, each run a fresh subprocess with PYTHONPATH=<its tree>. Per size:
the median over rounds of each run's median µs/step, the range over rounds, and A / B.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from bench.step_cost import build_engine, us_per_step
from engine.kv.prefix_hash import BlockHasher, digest_key
from engine.request import SamplingParams
from engine.sim.workload import TraceScale, load_trace

ROOT = Path(__file__).resolve().parents[1]
SMOKE = {"sizes": "1,8", "steps": 10, "requests": 64, "max_num_seqs": 8, "rounds": 1,
         "hash_rounds": 3, "hash_blocks": 512, "event_rounds": 1}


def steps_to_finish(outputs: list[int], batching: str, max_num_seqs: int) -> int:
    engine = build_engine(max_num_seqs, batching=batching)
    for i, out in enumerate(outputs):
        engine.add_request(f"r{i}", [7], SamplingParams(max_tokens=out, ignore_eos=True),
                           lane="batch")
    return len(engine.run_until_done())


def cont_vs_static(num_requests: int, max_num_seqs: int) -> dict[str, float]:
    outputs = [r.output_tokens for r in load_trace(limit=num_requests, scale=TraceScale())]
    static_theory = sum(max(outputs[i:i + max_num_seqs])
                        for i in range(0, len(outputs), max_num_seqs))
    cont_theory = math.ceil(sum(outputs) / max_num_seqs)
    measured = {m: steps_to_finish(outputs, m, max_num_seqs) for m in ("static", "continuous")}
    ratio = measured["static"] / measured["continuous"]
    theory = static_theory / cont_theory
    return {"static_steps": measured["static"], "continuous_steps": measured["continuous"],
            "static_theory": static_theory, "continuous_theory": cont_theory,
            "ratio": ratio, "theory_ratio": theory, "share_of_theory": ratio / theory}


def builtin_chain(token_ids: list[int], block_size: int, num_blocks: int) -> list[int]:
    """The hashing the BlockManager did before: Python's hash, root 0 (predictable)."""
    parent, out = 0, []
    for i in range(num_blocks):
        parent = hash((parent, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        out.append(parent)
    return out


def blake2b_chain(hasher: BlockHasher, token_ids: list[int], num_blocks: int) -> list[int]:
    """What the BlockManager does now: a tenant's root, then keyed blake2b per block."""
    digest, out = hasher.root("tenant-a", None), []
    for i in range(num_blocks):
        digest = hasher.block(digest, token_ids, i)
        out.append(digest_key(digest))
    return out


def block_hash_cost(rounds: int, num_blocks: int, block_size: int = 16) -> dict:
    """µs per full block, builtin vs keyed blake2b, alternating A B per round."""
    token_ids = [random.Random(0).randrange(150_000) for _ in range(num_blocks * block_size)]
    hasher = BlockHasher(block_size, "tenant")
    sides = (("builtin", partial(builtin_chain, token_ids, block_size, num_blocks)),
             ("blake2b", partial(blake2b_chain, hasher, token_ids, num_blocks)))
    runs: dict[str, list[float]] = {name: [] for name, _ in sides}
    for _, run in sides:  # warm-up, untimed
        run()
    for _ in range(rounds):
        for name, run in sides:
            t0 = time.perf_counter()
            run()
            runs[name].append((time.perf_counter() - t0) / num_blocks * 1e6)
    result: dict = {"block_size": block_size, "blocks_per_round": num_blocks, "rounds": rounds}
    for name, values in runs.items():
        result[name] = round(statistics.median(values), 3)
        result[f"{name}_range"] = [round(min(values), 3), round(max(values), 3)]
    result["ratio"] = round(result["blake2b"] / result["builtin"], 2)
    return result


def kv_events_cost(sizes: list[int], steps: int, rounds: int) -> dict:
    """Engine µs per step with arrivals, KV events off (A) and on (B), A B A B per size:
    per size the median over rounds of each side and B / A (a ratio per round, median)."""
    out: dict = {"rounds": rounds}
    for n in sizes:
        off, on, ratios = [], [], []
        for r in range(rounds):
            a = us_per_step(n, arrivals=True, steps=steps, seed=r)
            b = us_per_step(n, arrivals=True, steps=steps, seed=r, kv_events=True)
            off.append(a)
            on.append(b)
            ratios.append(b / a)
        out[str(n)] = {"off_us": round(statistics.median(off), 1),
                       "on_us": round(statistics.median(on), 1),
                       "on_over_off": round(statistics.median(ratios), 3),
                       "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)]}
    return out


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"scheduler_overhead: git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def drive(driver: Path, tree: Path, sizes: str, steps: int) -> dict[str, dict[str, float]]:
    """One run of the step-cost driver with `engine` from `tree`: {mode: {size: µs/step}}."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # only `tree` provides engine
    done = subprocess.run([sys.executable, str(driver), "--sizes", sizes, "--steps", str(steps)],
                          cwd=driver.parent, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"scheduler_overhead: the driver failed on {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def against(ref: str, sizes: str, steps: int, rounds: int) -> dict:
    """Part 1 on this tree (A) and on `ref` (B), A B A B ...; per mode and size: medians and
    ranges over rounds (µs/step) and the ratio of the medians, A / B."""
    label_b = git("rev-parse", "--short", ref)
    label_a = git("describe", "--always", "--dirty")
    runs: dict[str, list] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="bench-against-") as tmp:
        driver = Path(tmp) / "driver" / "step_cost.py"  # alone in its folder: sys.path[0]
        driver.parent.mkdir()
        shutil.copy(ROOT / "bench" / "step_cost.py", driver)
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", "--quiet", str(tree), ref)
        try:
            for i in range(rounds):
                for side, path in (("A", ROOT), ("B", tree)):
                    runs[side].append(drive(driver, path, sizes, steps))
                print(f"  round {i + 1}/{rounds} done", flush=True)
        finally:  # not git(): a failure here must not hide the one that got us here
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)
    result: dict = {"a": label_a, "b": label_b, "rounds": rounds, "steps": steps}
    print(f"A = this tree ({label_a}), B = {ref} ({label_b}); {rounds} round(s) of A then B, "
          f"each run the median of {steps} steps; µs/step: median over rounds [min-max]")
    for mode in ("decode", "arrivals"):
        print(f"{mode:>9} {'running':>8} {'A':>24} {'B':>24} {'A / B':>7}")
        result[mode] = {}
        for n in sizes.split(","):
            a = [r[mode][n] for r in runs["A"]]
            b = [r[mode][n] for r in runs["B"]]
            row = {"a_us": round(statistics.median(a), 1),
                   "a_range": [round(min(a), 1), round(max(a), 1)],
                   "b_us": round(statistics.median(b), 1),
                   "b_range": [round(min(b), 1), round(max(b), 1)]}
            row["ratio"] = round(statistics.median(a) / statistics.median(b), 3)
            result[mode][n] = row
            print(f"{'':>9} {n:>8} {_cell(row['a_us'], a):>24} {_cell(row['b_us'], b):>24} "
                  f"{row['ratio']:>7.2f}")
    return result


def _cell(median: float, values: list[float]) -> str:
    return f"{median:.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,16,64,256,512")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--against", metavar="REF", help="compare part 1 with this commit")
    ap.add_argument("--rounds", type=int, default=5, help="A B rounds for --against")
    ap.add_argument("--hash-rounds", type=int, default=15, help="A B rounds for part 3")
    ap.add_argument("--hash-blocks", type=int, default=8192, help="blocks hashed per round")
    ap.add_argument("--event-rounds", type=int, default=5,
                    help="A B rounds for part 4 (KV events off / on)")
    ap.add_argument("--smoke", action="store_true", help=f"tiny sizes: {SMOKE}")
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.against:
        print(json.dumps(against(args.against, args.sizes, args.steps, args.rounds)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"machine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}; simulated executor (zero model cost)")
    print(f"{'running':>8} {'decode us/step':>15} {'arrivals us/step':>17} {'us/seq':>8}")
    decode, mixed = {}, {}
    for n in sizes:
        decode[n] = us_per_step(n, arrivals=False, steps=args.steps)
        mixed[n] = us_per_step(n, arrivals=True, steps=args.steps)
        print(f"{n:>8} {decode[n]:>15.1f} {mixed[n]:>17.1f} {decode[n] / n:>8.2f}")
    cvs = cont_vs_static(args.requests, args.max_num_seqs)
    print(f"continuous vs static on {args.requests} trace output lengths, max_num_seqs="
          f"{args.max_num_seqs}: static {cvs['static_steps']} steps (theory "
          f"{cvs['static_theory']}), continuous {cvs['continuous_steps']} (ideal "
          f"{cvs['continuous_theory']}); ratio {cvs['ratio']:.2f} vs {cvs['theory_ratio']:.2f}"
          f" in theory = {cvs['share_of_theory']:.1%}")
    bh = block_hash_cost(args.hash_rounds, args.hash_blocks)
    cells = {k: f"{bh[k]:.3f} [{bh[k + '_range'][0]:.3f}-{bh[k + '_range'][1]:.3f}]"
             for k in ("builtin", "blake2b")}
    print(f"block hashing, µs per full {bh['block_size']}-token block, median [min-max] of"
          f" {bh['rounds']} rounds of {bh['blocks_per_round']} blocks (A B A B): builtin hash"
          f" {cells['builtin']}, keyed blake2b {cells['blake2b']}; ratio {bh['ratio']:.2f}")
    events = kv_events_cost(sizes, args.steps, args.event_rounds)
    for n in sizes:
        row = events[str(n)]
        print(f"KV events, {n} running with arrivals: off {row['off_us']:.1f} µs/step, on"
              f" {row['on_us']:.1f}; on/off {row['on_over_off']:.3f}"
              f" [{row['ratio_range'][0]:.3f}-{row['ratio_range'][1]:.3f}]"
              f" ({events['rounds']} rounds, A B A B)")
    print(json.dumps({
        "us_per_step": {str(n): round(v, 1) for n, v in decode.items()},
        "kv_events": events,
        "us_per_step_with_arrivals": {str(n): round(v, 1) for n, v in mixed.items()},
        "cont_vs_static": round(cvs["ratio"], 3),
        "share_of_theory": round(cvs["share_of_theory"], 3),
        "block_hash_us": bh,
    }))


if __name__ == "__main__":
    main()
