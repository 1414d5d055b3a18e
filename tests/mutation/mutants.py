"""`make mutants`: plant known bugs one at a time in a copy of the tree and check that the
tests named for each fail, so a test that quietly stops testing its feature is seen.

    python tests/mutation/mutants.py [--only NAME[,NAME]] [--list]

Each mutant (tests/mutation/mutant_list.py) replaces one exact piece of a source file with a bug a
person could plausibly write: a comparison flipped, a check skipped, an off-by-one. The
copy is of the checkout's files (tracked, or new and not ignored) in a temporary folder,
so the working tree is never touched; first the named tests run once on the copy as it is
(they must pass), then each mutant is planted, its tests run (pytest -x) and it is taken
out again.

    killed     a named test failed on the bug: the tests see it
    SURVIVED   they all passed: the feature is not tested where the mutant says
    stale      the piece to replace is not in the file exactly once (the code moved:
               update the mutant; tests/mutation/test_mutant_list.py fails on this too)
    error      pytest could not run the tests (collection, usage)

Exit status 0 when every mutant was killed. Not part of `make test` (it runs the named
tests once per mutant: 4-10 s a mutant, 1.5-3 hours for the whole list);
tests/mutation/test_mutant_list.py keeps the list current.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutant_list import MUTANTS, Mutant  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
TIMEOUT_S = 600
TIMED_OUT = -1000  # run_tests' status for a run it stopped


def copy_tree(dest: Path) -> None:
    """The checkout's files as they are now (tracked, and new ones git does not ignore),
    without build outputs."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    """(pytest's exit status, the first failing test's line, else its last line); a run
    past TIMEOUT_S is stopped and reads as TIMED_OUT (an error: a test that hangs on a bug
    instead of failing costs CI its whole timeout)."""
    try:
        done = subprocess.run([*PYTEST, "-rf", *tests], cwd=tree, env=ENV,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return TIMED_OUT, f"timed out after {TIMEOUT_S} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    failed = [line for line in lines if line.startswith("FAILED ")]
    return done.returncode, (failed or lines or [""])[0 if failed else -1][:160]


def verdict(tree: Path, mutant: Mutant) -> tuple[str, str]:
    """(killed | SURVIVED | stale | error, a detail) of one mutant planted in `tree`."""
    path = tree / mutant.path
    text = path.read_text()
    if text.count(mutant.old) != 1:
        return "stale", f"{mutant.path}: the piece is there {text.count(mutant.old)} times"
    path.write_text(text.replace(mutant.old, mutant.new))
    try:
        code, last = run_tests(tree, mutant.tests)
    finally:
        path.write_text(text)
    if code == 1:
        return "killed", last
    if code == 0:
        return "SURVIVED", f"{' '.join(mutant.tests)} all passed"
    return "error", f"pytest exit {code}: {last}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    args = parser.parse_args(argv)
    chosen = MUTANTS
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.name for m in MUTANTS}
        if unknown:
            parser.error(f"no mutant named {', '.join(sorted(unknown))}")
        chosen = [m for m in MUTANTS if m.name in wanted]
    if args.list:
        for m in chosen:
            print(f"{m.name:32s} {m.path}: {m.why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="batchpilot-mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        print(f"the {len(tests)} named tests on the tree as it is ...", flush=True)
        code, last = run_tests(tree, tests)
        if code != 0:
            print(f"they do not pass as it is (pytest exit {code}: {last}): fix that first")
            return 2
        return plant_each(tree, chosen)


def plant_each(tree: Path, chosen: list[Mutant]) -> int:
    started, results = time.monotonic(), []
    for i, mutant in enumerate(chosen, 1):
        t0 = time.monotonic()
        status, detail = verdict(tree, mutant)
        results.append(status)
        print(f"[{i}/{len(chosen)}] {status:8s} {mutant.name} ({time.monotonic() - t0:.0f} s):"
              f" {detail}", flush=True)
    bad = len(results) - results.count("killed")
    print(f"{results.count('killed')} of {len(results)} mutants killed in"
          f" {time.monotonic() - started:.0f} s" + (f"; {bad} not" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
