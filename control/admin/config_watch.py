"""The serving YAML, watched: an edit (or SIGHUP) is reloaded through the same validation,
versioning and audit as a change made through the control API.

Only what the file names is applied: its `serving:` live settings, its `lanes:` (the
whole set: a lane missing from the file is removed, and refused while it has requests),
and its profiles. Settings the file does not name keep their live values. A static
setting (KV pool, block size, max_model_len) that differs from the running one refuses
the whole reload: it needs a restart (a max_model_len the model capped compares as
capped). The file's settings and each profile are checked against the running static
config, as the start checked them against the fitted one. A refused reload is logged with
its reason and the config in force stays as it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any

import yaml

from control.admin.config_store import ChangeError, ConfigStore
from engine.config import EngineConfig, StaticConfig
from engine.config.patch import apply_patch, lane_to_dict
from engine.config.yaml_loader import (
    KEY_ALIASES,
    LIVE_KEYS,
    STATIC_KEYS,
    check_profiles,
    load_config_dict,
)

log = logging.getLogger("batchpilot.control")
POLL_S = 1.0


class ConfigWatcher:
    def __init__(self, store: ConfigStore, path: str, poll_s: float = POLL_S):
        self.store, self.path, self.poll_s = store, path, poll_s
        self.last_error: str | None = None  # why the last reload was refused
        self._digest = self._read_digest()
        self._pending: asyncio.Future | None = None  # a reload SIGHUP started

    def trigger(self) -> None:
        """Reload now (SIGHUP), even if the file looks unchanged (event loop thread)."""
        self._digest = self._read_digest()
        self._pending = asyncio.ensure_future(self.reload())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            digest = self._read_digest()
            if digest is not None and digest != self._digest:
                self._digest = digest
                await self.reload()

    async def reload(self) -> int | None:
        """Apply the file; the new version, or None when nothing changed or it was refused."""
        try:
            patch, profiles = self._read_patch()
            result = await self.store.patch(patch, expected_version=None,
                                            actor=f"file:{self.path}", source="file",
                                            reason="config file reloaded")
        except (ValueError, ChangeError) as exc:
            self.last_error = getattr(exc, "message", None) or str(exc)
            log.error("config file %s NOT applied (the config in force is unchanged): %s",
                      self.path, self.last_error)
            return None
        self.store.reloaded_profiles = profiles
        self.last_error = None
        if not result.applied:
            log.info("config file %s reloaded: no live setting changed", self.path)
            return None
        return result.version

    def _read_digest(self) -> str | None:
        try:
            return hashlib.sha256(Path(self.path).read_bytes()).hexdigest()
        except OSError:
            return None

    def _read_patch(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        try:
            data = yaml.safe_load(Path(self.path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read it: {exc}") from None
        loaded = load_config_dict(data)  # the checks that need no model, as at start
        serving = {KEY_ALIASES.get(k, k): v for k, v in (data.get("serving") or {}).items()}
        static, fitted = self.store.static, self.store.fitted_static
        changed = sorted(k for k in serving if k in STATIC_KEYS
                         and _as_fitted(k, serving[k], static, fitted) != getattr(static, k))
        if changed:
            raise ValueError(f"static setting(s) {', '.join(changed)} differ from the running"
                             " server's; they need a restart")
        patch: dict[str, Any] = {k: v for k, v in serving.items() if k in LIVE_KEYS}
        live = self.store.current()
        if "lanes" in data:
            new = {lane.name for lane in loaded.config.live.lanes}
            patch["lanes"] = {**{name: None for name in live.lane_names if name not in new},
                              **{lane.name: lane_to_dict(lane) for lane in
                                 loaded.config.live.lanes}}
        # the rest of the start's checks: against the running (fitted) static config, the
        # profiles on the config this reload installs
        after = apply_patch(live, static, patch)
        check_profiles(loaded.profiles, EngineConfig(static, after), fitted)
        return patch, loaded.profiles


def _as_fitted(name: str, value: Any, static: StaticConfig, fitted: frozenset[str]) -> Any:
    """`value` of a static field as the start would have fitted it: a max_model_len the
    model capped is its context (the running value), so a file asking for as much or more
    (the 32768 of DESIGN.md on an 8192 model) changes nothing."""
    if name == "max_model_len" and name in fitted and isinstance(value, int):
        return min(value, static.max_model_len)
    return value

