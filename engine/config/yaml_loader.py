"""Load an `EngineConfig` from YAML (or a dict of the same shape).

The file's shape::

    serving:            # the seed's block from DESIGN.md loads as written
      max_active_sequences: 128
      max_batched_tokens: 8192
      max_model_len: 32768
      ...
    lanes:              # optional; replaces the default lanes when present
      interactive: {weight: 4, policy: priority}
      batch: {weight: 1, preempt_first: true}
    profiles:           # optional named sets of live changes (applied by the control API)
      degrade: {max_num_seqs: 32, max_num_batched_tokens: 2048}
    telemetry:          # optional: the server's OTLP export (control/otel, not the engine)
      otlp_traces_endpoint: http://127.0.0.1:4318/v1/traces

Both the seed's key names and ours are accepted. Unknown keys are errors that list the
allowed keys, so a typo never silently falls back to a default.

Loading checks what needs no model: keys, types, ranges, lanes. What depends on the static
config (a budget against max_model_len, max_num_seqs against the KV pool) is checked once
the model has fitted it (`EngineConfig.validate`, `check_profiles`): the YAML's own static
values, or the defaults, are not what the server runs with (max_model_len is capped at
the model's context, the KV pool sized to memory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from engine.config.field_types import check_field_types
from engine.config.known_keys import check_known_keys
from engine.config.schema import (
    FIELD_TYPES,
    LANE_FIELD_TYPES,
    EngineConfig,
    LaneConfig,
    LiveConfig,
    StaticConfig,
)

# The seed's names (DESIGN.md) -> ours.
KEY_ALIASES = {
    "max_active_sequences": "max_num_seqs",
    "max_batched_tokens": "max_num_batched_tokens",
}
STATIC_KEYS = {f.name for f in dataclasses.fields(StaticConfig)}
LIVE_KEYS = {f.name for f in dataclasses.fields(LiveConfig)} - {"lanes", "version"}
LANE_KEYS = {f.name for f in dataclasses.fields(LaneConfig)} - {"name"}
# telemetry: the server's OpenTelemetry export, read by control/otel/cli_args.py (the
# engine has no part in it and ignores the block)
TOP_LEVEL_KEYS = {"serving", "lanes", "profiles", "telemetry"}


@dataclasses.dataclass(frozen=True)
class LoadedConfig:
    config: EngineConfig  # checked as far as it can be without the model (see above)
    profiles: dict[str, dict[str, Any]]


def read_yaml_file(path: str | Path, what: str = "config file") -> Any:
    """The parsed file; ValueError when it is missing or not YAML."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {str(path)!r} is not valid YAML: {exc}") from None


def load_config_file(path: str | Path) -> LoadedConfig:
    return load_config_dict(read_yaml_file(path) or {})


def load_config_dict(data: dict[str, Any]) -> LoadedConfig:
    if not isinstance(data, dict):
        raise ValueError("config must be a mapping with a 'serving:' block")
    check_known_keys("config", data, TOP_LEVEL_KEYS,
                nested={"serving": STATIC_KEYS | LIVE_KEYS | set(KEY_ALIASES)})
    serving = _normalise(data.get("serving") or {}, "serving")
    static_kw = {k: v for k, v in serving.items() if k in STATIC_KEYS}
    live_kw = {k: v for k, v in serving.items() if k in LIVE_KEYS}
    if "lanes" in data:
        live_kw["lanes"] = parse_lanes(data["lanes"])
    config = EngineConfig(StaticConfig(**static_kw), LiveConfig(**live_kw))
    config.static.validate()
    config.live.validate_fields()  # against the static config once fitted: see the docstring
    profiles = {}
    for name, changes in (data.get("profiles") or {}).items():
        changes = _normalise(changes or {}, f"profiles.{name}", allowed=LIVE_KEYS)
        try:  # found now, not when an operator applies it in an incident
            config.live.replace(**changes).validate_fields()
        except ValueError as exc:
            raise ValueError(f"profiles.{name}: {exc}") from None
        profiles[str(name)] = changes
    return LoadedConfig(config, profiles)


def check_profiles(profiles: dict[str, dict[str, Any]], config: EngineConfig,
                   fitted: Collection[str] = ()) -> None:
    """Each profile applied to `config` (the one in force: at start, the fitted one) must
    validate, so a bad profile fails the start, not the `ctl profile` of an incident.
    `fitted`: the static fields the model chose, named so in the ValueError."""
    for name, changes in profiles.items():
        try:
            config.live.replace(**changes).validate(config.static, fitted)
        except ValueError as exc:
            raise ValueError(f"profiles.{name}: {exc}") from None


def parse_lanes(lanes: Any) -> tuple[LaneConfig, ...]:
    """Lanes as a mapping name -> settings, or a list of settings with `name`."""
    if isinstance(lanes, dict):
        items = [(str(name), settings or {}) for name, settings in lanes.items()]
    elif isinstance(lanes, list):
        items = []
        for entry in lanes:
            if not isinstance(entry, dict) or "name" not in entry:
                raise ValueError("each entry of 'lanes' must be a mapping with a 'name'")
            entry = dict(entry)
            items.append((str(entry.pop("name")), entry))
    else:
        raise ValueError("'lanes' must be a mapping of lane name to settings")
    result = []
    for name, settings in items:
        if not isinstance(settings, dict):
            raise ValueError(f"lanes.{name} must be a mapping of settings")
        check_known_keys(f"lanes.{name}", settings, LANE_KEYS)
        check_field_types(settings, f"lanes.{name}.", LANE_FIELD_TYPES)
        result.append(LaneConfig(name=name, **settings))
    return tuple(result)


def _normalise(block: dict[str, Any], where: str,
               allowed: set[str] | None = None) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise ValueError(f"'{where}' must be a mapping")
    allowed = allowed if allowed is not None else STATIC_KEYS | LIVE_KEYS
    renamed = {KEY_ALIASES.get(k, k): v for k, v in block.items()}
    check_known_keys(where, renamed, allowed | set(KEY_ALIASES))
    check_field_types(renamed, f"{where}.", FIELD_TYPES)
    return renamed
