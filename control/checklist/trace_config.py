"""The config as far as a trace file tells it (no server to ask): what `runs.settings`
names (the serving YAML, if it is readable here, and the engine overrides), then the
run's `config_changes` replayed, then what the steps and KV snapshots recorded, which
wins (it is what was in force). Settings none of these tell are left out, so a check
can say exactly what is missing.
"""

from __future__ import annotations

import json
from typing import Any

from control.trace.audit_sources import is_config_version
from engine.config.yaml_loader import STATIC_KEYS

# Defaults the server fits to the model when the YAML does not set them (engine/llm.py):
# their value cannot be known from the YAML alone.
FITTED_LIVE = ("max_num_seqs", "prefill_chunk_size", "long_context_threshold")


def config_from_trace(facts: dict[str, Any], changes: list[dict[str, Any]]
                      ) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(live config, static config, where they came from), both possibly partial."""
    run = facts.get("run") or {}
    settings = _json(run.get("settings")) or {}
    config, static, sources = _from_settings(settings)
    started = run.get("started") or 0.0
    replayed = 0
    for row in changes:
        if (row.get("time") or 0.0) >= started and is_config_version(row.get("source")):
            for key, (_, new) in (_json(row.get("change")) or {}).items():
                _set_path(config, key.split("."), new)
                replayed += 1
    if replayed:
        sources.append(f"{replayed} config change(s) replayed")
    observed = _observed(facts, config, static)
    if observed:
        sources.append("observed in the trace: " + ", ".join(observed))
    return config, static, "from the trace: " + ("; ".join(sources) or "nothing about config")


def _from_settings(settings: dict[str, Any]) -> tuple[dict, dict, list[str]]:
    from engine.config import LiveConfig
    from engine.config.patch import live_to_dict

    config: dict[str, Any] = {}
    static: dict[str, Any] = {}
    sources: list[str] = []
    path = settings.get("config")
    if "config" in settings and path is None:  # embedded defaults, fitted to the model
        config = _unfitted(live_to_dict(LiveConfig()), explicit=set())
        static["block_size"] = 16
        sources.append("built-in defaults (the server ran without --config)")
    elif path:
        try:
            from control.serve.bootstrap import read_serving_config

            serving = read_serving_config(path)
        except (OSError, ValueError) as exc:
            sources.append(f"config YAML {path} not readable here ({exc})")
        else:
            config = _unfitted(live_to_dict(serving.live), set(serving.explicit))
            static = {k: v for k, v in serving.explicit.items() if k in STATIC_KEYS}
            static.setdefault("block_size", 16)
            sources.append(f"config YAML {path} (as it is now)")
    overrides = settings.get("engine_overrides") or {}
    for key, value in overrides.items():
        (static if key in STATIC_KEYS else config)[key] = value
    if overrides:
        sources.append("runs.settings engine_overrides")
    fitted = {k: v for k, v in (settings.get("fitted_budgets") or {}).items()
              if k in FITTED_LIVE}
    if fitted:  # what the server fitted to its device where its config left them unset
        config.update(fitted)
        sources.append("runs.settings fitted_budgets")
    return config, static, sources


def _unfitted(live: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    return {k: v for k, v in live.items() if k not in FITTED_LIVE or k in explicit}


def _observed(facts: dict[str, Any], config: dict, static: dict) -> list[str]:
    seen = []
    step = facts.get("last_step")
    if step:
        config["max_num_seqs"] = step["max_num_seqs"]
        config["max_num_batched_tokens"] = step["token_budget"]
        static["num_kv_blocks"] = step["kv_blocks_total"]
        lanes = config.get("lanes") or {}
        config["lanes"] = {name: lanes.get(name, {}) for name in step["lanes"] or ()}
        seen.append(f"step {step['step_id']} (max_num_seqs, token budget, lanes, KV pool)")
    snap = facts.get("last_kv_snapshot")
    if snap:
        config["kv_cache_high_watermark"] = snap["high_watermark"]
        config["kv_cache_reject_watermark"] = snap["reject_watermark"]
        static["num_kv_blocks"] = snap["total"]
        seen.append(f"KV snapshot at step {snap['step_id']} (watermarks)")
    return seen


def _set_path(node: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            return
    if value is None and len(keys) == 2 and keys[0] in ("lanes", "tenant_lanes"):
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value


def _json(text: Any) -> Any:
    if isinstance(text, dict | list) or text is None:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None
