"""`make test`'s runner: the suite as two pytest processes side by side, then each one's
output in full, exit status 0 only when both passed.

    python tests/run_suites.py [PYTEST ARGS...]

Most tests use one core (one Python process, a server starting, a subprocess importing
torch): the suite one after the other kept a 2-core machine under half busy. The tests
marked one_process (tests/conftest.py: the bench smokes' pool and the Ray fleet's tests)
run in one process and everything else in the other, both over the whole `tests` folder,
so a test lands in exactly one of them. Then the tests marked quiet run alone (reports
judged on a live server's p99 latency). Each writes its own log; the runner prints a line
as each ends and the logs after (CI shows them in full).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = {"one_process (bench smokes, Ray fleet)": ["-m", "one_process and not quiet"],
          "everything else": ["-m", "not one_process and not quiet"]}
# then with no suite beside them: verdicts judged on the p99 of a live server's requests
# (the scripted incident of tests/fixtures/incident.py, the fleet's canaries), which a
# neighbour's load moved. First the files marked plain quiet, in one process (the Ray
# canaries: their fleet keeps ~1.6 cores busy; beside an incident, a good canary rolled
# back); then those marked quiet(light=True), LIGHT_PROCESSES processes side by side (one
# in-process server each, ~0.6 of a core: the two incidents side by side passed 3 of 3
# runs here, 32 s against 45 s one after the other)
QUIET_MARK = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.quiet\b", re.M)
LIGHT_MARK = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.quiet\(light=True\)", re.M)
LIGHT_PROCESSES = 2
DURATIONS = ["--durations=25", "--durations-min=5"]
NO_TESTS = 5  # pytest's exit status when a selection (-k, a path) leaves a suite empty
# NOTE: the suites, the smokes' pool and their servers keep 4-6 processes runnable on 2
# cores. torch's OpenMP (libgomp) workers spin ~300k turns after each parallel region while
# they wait for the next; they cannot see the other processes, so they spun on the cores
# the others waited for (a smoke's machine-wide CPU seconds: hostile_traffic 54 -> 42,
# offline_throughput 11 -> 9.5 with PASSIVE). Tests judge behaviour and the smokes' figures
# only for sanity; the benchmarks themselves run with the machine's defaults.
SUITE_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
Suite = tuple[list[str], list[str]]  # a pytest process's marks (-m ...) and paths


def main(args: list[str]) -> int:
    started = time.monotonic()
    codes = run_side_by_side({name: (marks, ["tests"]) for name, marks in SUITES.items()},
                             args, started)
    # only the files that mark themselves quiet: collecting all of tests/ for them costs
    # a process ~13 s of the phase that runs alone
    for stage in quiet_stages():
        codes.update(run_side_by_side(stage, args, started))
    failed = [name for name, code in codes.items() if code not in (0, NO_TESTS)]
    print(f"\n{len(codes) - len(failed)} of {len(codes)} suites passed in"
          f" {time.monotonic() - started:.0f} s" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


def quiet_files() -> list[str]:
    """Test files whose module-level pytestmark includes pytest.mark.quiet."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if QUIET_MARK.search(p.read_text()))


def quiet_stages() -> list[dict[str, Suite]]:
    """The quiet phase's stages, one after the other, each {suite name: (marks, files)}
    run side by side: the heavy quiet files in one process, then the light ones dealt
    round-robin to LIGHT_PROCESSES processes."""
    files = quiet_files()
    light = [f for f in files if LIGHT_MARK.search((ROOT / f).read_text())]
    heavy = [f for f in files if f not in light]
    stages = [{"quiet (judged on p99 latency)": (["-m", "quiet"], heavy)}] if heavy else []
    groups = [light[i::LIGHT_PROCESSES] for i in range(LIGHT_PROCESSES)]
    together = {f"quiet, light {i + 1} (judged on p99 latency)": (["-m", "quiet"], group)
                for i, group in enumerate(groups) if group}
    return stages + ([together] if together else [])


def run_side_by_side(suites: dict[str, Suite], args: list[str],
                     started: float) -> dict[str, int]:
    """Each suite (name -> its marks and paths) a pytest process over its paths with `args`,
    all at once; each one's log printed once all ended."""
    with tempfile.TemporaryDirectory(prefix="batchpilot-suites-") as tmp:
        runs = {}
        for i, (name, (marks, paths)) in enumerate(suites.items()):
            log = Path(tmp) / f"suite-{i}.log"
            with log.open("w") as out:
                # the slowest tests in the log: where the next cut to make test's time is
                proc = subprocess.Popen([sys.executable, "-m", "pytest", *marks, *DURATIONS,
                                         *args, *paths],
                                        cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                        env={**SUITE_ENV, **os.environ})
            runs[name] = (proc, log)
        codes = {}
        try:
            pending = dict(runs)
            while pending:
                for name, (proc, _) in list(pending.items()):
                    if proc.poll() is not None:
                        codes[name] = proc.returncode
                        print(f"[{time.monotonic() - started:6.0f} s] {name}: exit"
                              f" {proc.returncode}", flush=True)
                        del pending[name]
                time.sleep(1)
        except KeyboardInterrupt:
            for proc, _ in runs.values():
                proc.terminate()
            raise
        for name, (_, log) in runs.items():
            print(f"\n===== {name} =====", flush=True)
            try:
                sys.stdout.write(log.read_text(errors="replace"))
            except OSError as exc:  # the folder removed under us: say so, keep the verdict
                print(f"(its log is gone: {exc})")
    return codes


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
