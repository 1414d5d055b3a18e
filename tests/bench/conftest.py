"""One SmokePool (smoke_pool.py) for the session's selected smoke runs and gpu_check.sh's
dry run, started as soon as the session's tests are collected: the one_process suite runs
its other tests while the pool works (tests/conftest.py orders them so), and each smoke
test asks the pool for its own job's result."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import pytest
from smoke_pool import SmokePool
from test_bench_smoke import smoke_run
from test_gpu_check_dry_run import dry_run

POOL = pytest.StashKey[SmokePool]()
FOLDER = pytest.StashKey[Path]()


def pytest_collection_finish(session) -> None:
    """Start the pool over the selected smoke tests' jobs (none: no pool)."""
    if session.config.option.collectonly:
        return
    folder = Path(tempfile.mkdtemp(prefix="batchpilot-smokes-"))
    jobs = {}
    for item in session.items:
        name = getattr(item, "originalname", "")
        if name == "test_benchmark_runs_in_smoke_mode":
            bench = item.callspec.params["name"]
            jobs[f"smoke:{bench}"] = functools.partial(smoke_run, bench, folder / bench)
        elif name == "test_dry_run_runs_every_step_and_writes_the_summary":
            jobs["gpu_check_dry_run"] = functools.partial(dry_run, folder / "gpu_check")
    session.config.stash[FOLDER] = folder
    if jobs:
        session.config.stash[POOL] = SmokePool(jobs)


def pytest_sessionfinish(session) -> None:
    pool = session.config.stash.get(POOL, None)
    if pool is not None:
        pool.close()
    folder = session.config.stash.get(FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def smokes(request) -> SmokePool:
    return request.config.stash[POOL]


def pytest_terminal_summary(terminalreporter, config) -> None:
    """Each smoke's own wall time (pytest's durations show only waits on the pool), so the
    next cut to `make test`'s time is visible in CI's log."""
    pool = config.stash.get(POOL, None)
    if pool is None or not pool.seconds:
        return
    terminalreporter.section("bench smokes (wall seconds, two at a time)")
    for name, seconds in sorted(pool.seconds.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:7.1f}  {name}")
