"""Several replays of one window: one per config, in order or side by side in processes,
on one replica (control/whatif/replay.py) or on a fleet of them (fleet_replay.py).

    predictions = replays(window, model, {"predicted": recorded, "seqs64": c}, replicas=1)
"""

from __future__ import annotations

import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from control.whatif.calibrate import StepTimeModel
from control.whatif.fleet_replay import replay_fleet
from control.whatif.replay import Prediction, replay
from control.whatif.window import Window
from engine.config import EngineConfig


def replays(window: Window, model: StepTimeModel, configs: dict[str, EngineConfig],
            progress: bool = False, workers: int = 1, replicas: int = 1,
            ) -> dict[str, Prediction]:
    """One replay per config, in order; with `workers` > 1 in spawned processes (the same
    predictions: a replay is deterministic), the progress bar of the first one only;
    `replicas` > 1: each on that many replicas behind the fleet's router."""
    run = replay if replicas == 1 else functools.partial(replay_fleet, replicas=replicas)
    if workers <= 1 or len(configs) <= 1:
        return {name: run(window, c, model, name, progress) for name, c in configs.items()}
    # NOTE: spawn, not fork: the caller may hold threads (a DuckDB connection, the server)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(configs)), mp_context=ctx) as pool:
        jobs = {name: pool.submit(run, window, c, model, name, progress and i == 0)
                for i, (name, c) in enumerate(configs.items())}
        return {name: job.result() for name, job in jobs.items()}
