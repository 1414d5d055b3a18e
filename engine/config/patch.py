"""Live config changes as data: a LiveConfig as a plain dict, a JSON merge patch (RFC 7396)
onto it, and the diff between two snapshots.

    data = live_to_dict(live)           # lanes and tenant_lanes as mappings by name
    new = apply_patch(live, static, {"max_num_seqs": 64, "lanes": {"batch": None}})
    diff(live, new)                     # {"max_num_seqs": [128, 64], "lanes.batch": [{...}, None]}

The patch goes through the YAML loader's checks (known keys, types, the seed's aliases),
then `LiveConfig.validate(static)`: an invalid change raises ValueError naming the field
and nothing changes. Static settings (KV pool, block size, max_model_len) are refused:
they need a restart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.config.schema import LaneConfig, LiveConfig, StaticConfig
from engine.config.yaml_loader import KEY_ALIASES, LIVE_KEYS, STATIC_KEYS, _normalise, parse_lanes

MAPPINGS = ("lanes", "tenant_lanes")  # merged key by key; a null value removes the entry
NULLABLE = ("long_context_lane",)  # null sets None (no long-context routing)


def lane_to_dict(lane: LaneConfig) -> dict[str, Any]:
    data = dataclasses.asdict(lane)
    del data["name"]
    return data


def live_to_dict(live: LiveConfig) -> dict[str, Any]:
    data = {f.name: getattr(live, f.name) for f in dataclasses.fields(LiveConfig)
            if f.name not in ("lanes", "tenant_lanes", "version")}
    data["tenant_lanes"] = dict(live.tenant_lanes)
    data["default_slo"] = live.default_slo.to_dict()
    data["lanes"] = {lane.name: lane_to_dict(lane) for lane in live.lanes}
    return data


def static_to_dict(static: StaticConfig) -> dict[str, Any]:
    return dataclasses.asdict(static)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7396: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def live_from_dict(data: dict[str, Any]) -> LiveConfig:
    """The inverse of live_to_dict, with the YAML loader's key and type checks."""
    if not isinstance(data, dict):
        raise ValueError("the config must be a JSON object")
    data = dict(data)
    lanes = data.pop("lanes", None)
    tenant_lanes = data.pop("tenant_lanes", None) or {}
    static = sorted(k for k in data if KEY_ALIASES.get(k, k) in STATIC_KEYS)
    if static:
        raise ValueError(f"{', '.join(static)}: static setting(s), fixed at start (the KV pool"
                         " is allocated for them); change them in the YAML and restart")
    kwargs = _normalise(data, "config", allowed=LIVE_KEYS - {"tenant_lanes"})
    if not isinstance(tenant_lanes, dict) or not all(
            isinstance(v, str) for v in tenant_lanes.values()):
        raise ValueError("tenant_lanes must map tenant names to lane names")
    if lanes is not None:
        if not isinstance(lanes, dict) or not lanes:
            raise ValueError("lanes must be a non-empty mapping of lane name to settings")
        kwargs["lanes"] = parse_lanes(lanes)
    return LiveConfig(**kwargs, tenant_lanes=tenant_lanes)


def apply_patch(live: LiveConfig, static: StaticConfig, patch: dict[str, Any]) -> LiveConfig:
    """`live` with `patch` merged in and validated against `static` (version kept)."""
    if not isinstance(patch, dict):
        raise ValueError("changes must be a JSON object of settings")
    patch = {KEY_ALIASES.get(k, k): v for k, v in patch.items()}
    for key in patch:
        if patch[key] is None and key not in MAPPINGS + NULLABLE:
            raise ValueError(f"{key}=null: a setting cannot be removed, only changed")
    merged = merge(live_to_dict(live), patch)
    merged.update({key: None for key in NULLABLE if key in patch and patch[key] is None})
    new = live_from_dict(merged).replace(version=live.version)
    new.validate(static)
    return new


def diff(old: LiveConfig, new: LiveConfig) -> dict[str, list[Any]]:
    """Changed settings by dotted key -> [old, new]; a lane added or removed is one entry."""
    return _diff(live_to_dict(old), live_to_dict(new), "")


def apply_diff(live: LiveConfig, changes: dict[str, list[Any]]) -> LiveConfig:
    """`live` with the new side of a `diff` set (a recorded change replayed onto the config
    it was made to; the old side is not checked). Not validated: the caller does."""
    data = live_to_dict(live)
    for path, (_, new) in changes.items():
        if path.startswith("tenant_lanes."):  # a tenant's name may hold dots
            parents, last = ["tenant_lanes"], path[len("tenant_lanes."):]
        else:
            *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if new is None and len(parents) == 1 and parents[0] in MAPPINGS:
            node.pop(last, None)  # a lane or a tenant's lane removed
        else:
            node[last] = new
    return live_from_dict(data).replace(version=live.version)


def _diff(a: dict[str, Any], b: dict[str, Any], prefix: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for key in sorted(set(a) | set(b), key=str):
        path = f"{prefix}{key}"
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out.update(_diff(va, vb, path + "."))
        elif va != vb:
            out[path] = [va, vb]
    return out
