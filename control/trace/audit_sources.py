"""The `source` of a config_changes row that is not a config version: an audit of a
decision beside the config, which readers replaying the config's history must skip.

    drain, resume        an operator paused or reopened admission (control/admin)
    whatif               a prediction asked of the server (control/whatif/audit.py)
    step_law_refit       the scheduler refitted its step law from served steps
                         (engine/calibration/online_law.py; change {"step_law": [old, new]})
    step_threads         a CPU engine's steps changed their thread count (another process
                         on the cores: engine/calibration/thread_governor.py; change
                         {"threads": [old, new]})
    canary_*             a fleet canary's start and verdict (control/fleet/canary_run.py)
    autoscale_*          a fleet autoscaling event (control/fleet/scaling.py)
"""

from __future__ import annotations

LAW_REFIT_SOURCE = "step_law_refit"
THREADS_SOURCE = "step_threads"
NOT_VERSIONS = ("drain", "resume", "whatif", LAW_REFIT_SOURCE, THREADS_SOURCE)
NOT_VERSION_PREFIXES = ("canary_", "autoscale_")


def is_config_version(source: str | None) -> bool:
    """Whether a config_changes row of `source` records a config version."""
    source = source or ""
    return source not in NOT_VERSIONS and not source.startswith(NOT_VERSION_PREFIXES)
