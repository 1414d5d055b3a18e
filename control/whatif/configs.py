"""The config a window ran under, and the proposed ones built from it by merge patches.

The trace records budgets per step (`token_budget`, `max_num_seqs`), the KV pool's size
(`kv_blocks_used + kv_blocks_free`), the budgets fitted at start-up (runs.settings
`fitted_budgets`) and changes as diffs, not the whole config: the rest
comes from `base`, the server's own config when it answers (exact), else the serving YAML
given with `--config` (or named in the run's settings, if that file is still there), else
the built-in defaults. Every field taken from a guess is said in the notes.

    recorded, notes = recorded_config(window, base)
    proposed = propose(recorded, {"max_num_seqs": 64})   # ValueError naming the field
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from control.whatif.window import Window
from engine.config import EngineConfig, LaneConfig, LiveConfig
from engine.config.patch import apply_diff, apply_patch


def base_config(window: Window, config_path: str | None) -> tuple[EngineConfig, list[str]]:
    """The YAML given, else the one the run names if it still exists, else defaults."""
    from control.serve.bootstrap import read_serving_config
    from engine.config.yaml_loader import load_config_file

    path = config_path or window.run_settings.get("config")
    if path and (config_path or os.path.isfile(path)):
        loaded = load_config_file(path)
        read_serving_config(path)  # the same checks as the server's
        return loaded.config, [f"config not in the trace taken from {path}"]
    return EngineConfig(), ["no serving YAML (--config): settings the trace does not record"
                            " (block_size, max_model_len, lanes, watermarks, timeouts) are"
                            " the built-in defaults"]


def recorded_config(window: Window, base: EngineConfig, exact: bool = False,
                    ) -> tuple[EngineConfig, list[str]]:
    """`base` with what the trace says overlaid: budgets, KV pool, lanes the requests used.
    `exact`: base is the server's config at the window's version; only lanes are checked."""
    facts, notes = window.facts, []
    static, live = base.static, base.live
    if not exact:
        live = _fitted(live, window.run_settings.get("fitted_budgets") or {}, notes)
        live = _replayed(live, window.changes, notes)
        static = dataclasses.replace(static, num_kv_blocks=facts.num_kv_blocks)
        live = live.replace(max_num_batched_tokens=facts.max_num_batched_tokens,
                            max_num_seqs=facts.max_num_seqs)
        if facts.max_prefill_chunk > live.prefill_chunk_size:
            notes.append(f"prefill_chunk_size={facts.max_prefill_chunk}: a chunk that large"
                         f" ran, so the base's {live.prefill_chunk_size} was not in force")
            live = live.replace(prefill_chunk_size=facts.max_prefill_chunk)
        notes.append(f"from the trace: max_num_batched_tokens={live.max_num_batched_tokens},"
                     f" max_num_seqs={live.max_num_seqs}, num_kv_blocks={static.num_kv_blocks}"
                     f" (config version {facts.config_version})")
    missing = sorted({r.lane for r in window.requests} - set(live.lane_names))
    if missing:
        live = live.replace(lanes=live.lanes + tuple(LaneConfig(name) for name in missing))
        notes.append(f"lanes {', '.join(missing)} are in the trace but not the config: added"
                     " with default settings (weight 1, fcfs)")
    if facts.config_changes:
        notes.append(f"the config changed {facts.config_changes} time(s) inside the window;"
                     " every replay holds the config in force at its start")
    config = EngineConfig(static, live)
    try:
        config.validate()
    except ValueError as exc:
        raise ValueError(f"the recorded config, as reconstructed, is invalid: {exc}; pass the"
                         " server's YAML with --config") from None
    return config, notes


def _fitted(live: LiveConfig, fitted: dict[str, Any], notes: list[str]) -> LiveConfig:
    """`live` with the budgets the server fitted at start-up (runs.settings fitted_budgets:
    those its config left unset, engine/calibration/budget_fit.py), which no YAML holds."""
    known = {k: v for k, v in fitted.items() if hasattr(live, k) and isinstance(v, int)}
    if not known:
        return live
    notes.append("fitted by the server at start-up: " + ", ".join(
        f"{k}={v}" for k, v in sorted(known.items())))
    return live.replace(**known)


def _replayed(live: LiveConfig, changes: list[dict[str, list[Any]]],
              notes: list[str]) -> LiveConfig:
    """The config the run started on with its recorded changes up to the window replayed:
    a window after `ctl set step_policy=fixed` ran under the law, not the YAML's policy."""
    keys: set[str] = set()
    for change in changes:
        try:
            live = apply_diff(live, change)
        except ValueError as exc:  # made to another base than the one given here
            notes.append(f"a recorded change could not be replayed onto the base config"
                         f" ({exc}): {sorted(change)} left as the base has them")
            continue
        keys |= set(change)
    if keys:
        shown = ", ".join(sorted(keys)[:8]) + (", ..." if len(keys) > 8 else "")
        notes.append(f"{len(changes)} config change(s) recorded before the window replayed"
                     f" onto the base: {shown}")
    return live


def propose(recorded: EngineConfig, patch: dict[str, Any]) -> EngineConfig:
    """The recorded config with a live merge patch; ValueError naming a bad key or value
    (the control API's own validation: static settings are refused)."""
    return EngineConfig(recorded.static, apply_patch(recorded.live, recorded.static, patch))
