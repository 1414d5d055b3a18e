"""The live config's history and every way to change it: a patch, a profile, a rollback,
a reloaded YAML file. One lock orders the changes; each is checked against the version it
was based on (If-Match), validated in full before anything is installed, installed on the
engine thread between two steps (so it applies from the next step), then audited: in
memory (`history`), in the trace's `config_changes` table, and in the log.

Runs on the event loop; the engine is touched only through `AsyncEngine.call`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from control.api.errors import APIError, param_named
from control.serve.engine_loop import AsyncEngine
from control.trace.writer import TraceWriter
from engine.config import LiveConfig, StaticConfig
from engine.config.patch import apply_patch, diff, live_from_dict
from engine.lanes.routing import LaneNotEmptyError

log = logging.getLogger("batchpilot.control")
HISTORY_LIMIT = 1000  # versions kept in memory for rollback (the trace keeps them all)


class ChangeError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra

    def api_error(self) -> APIError:
        """This error as the control routes answer it (one server's and the fleet's), a
        `param` in `extra` as the error's own field."""
        extra = dict(self.extra)
        param = extra.pop("param", None)
        return APIError(self.status, self.message, code=self.code, param=param, extra=extra)

    @classmethod
    def invalid(cls, exc: ValueError) -> ChangeError:
        """A 400 of a config ValueError (`config.max_num_seqs='64' must be ...`), its
        `param` the setting it names, so a client need not parse the message."""
        name = param_named(str(exc))
        return cls(400, "invalid_value", str(exc),
                   **({"param": name.removeprefix("config.")} if name else {}))


@dataclass(frozen=True)
class ConfigVersion:
    version: int
    time: float
    actor: str
    source: str  # startup | api | profile | rollback | file
    reason: str
    diff: dict[str, list[Any]]
    live: LiveConfig


@dataclass(frozen=True)
class ChangeResult:
    applied: bool
    version: int
    diff: dict[str, list[Any]]
    live: LiveConfig


@dataclass
class ConfigStore:
    engine: AsyncEngine
    writer: TraceWriter | None = None
    history: list[ConfigVersion] = field(default_factory=list)
    reloaded_profiles: dict[str, dict[str, Any]] | None = None  # from a reloaded YAML
    # The fleet config version installed (control/fleet/versioning.py); None: not a fleet
    # replica. Written only on the engine thread, between steps, with the config it names.
    fleet_version: int | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def static(self) -> StaticConfig:
        return self._parts().static

    @property
    def fitted_static(self) -> frozenset[str]:
        """The static fields the model chose at start (bootstrap's `EngineParts`)."""
        return self._parts().fitted_static

    @property
    def step_fit(self):
        """The budgets fitted to the device at start-up (engine/calibration/budget_fit.py),
        or None."""
        return self._parts().step_fit

    @property
    def profiles(self) -> dict[str, dict[str, Any]]:
        if self.reloaded_profiles is not None:
            return self.reloaded_profiles
        return self._parts().profiles

    def current(self) -> LiveConfig:
        """The installed config; the first call records it as the starting version."""
        self._parts()
        live = self.engine.live_config
        if not self.history:
            self._record(ConfigVersion(live.version, time.time(), "server", "startup", "",
                                       {}, live))
        return live

    def _parts(self):
        if self.engine.parts is None:
            raise ChangeError(503, "loading", "the model is loading; try again shortly")
        return self.engine.parts

    async def patch(self, changes: dict[str, Any], *, expected_version: int | None,
                    actor: str, source: str = "api", reason: str = "",
                    lane_moves: dict[str, str] | None = None,
                    dry_run: bool = False) -> ChangeResult:
        async with self._lock:
            current = self._check_version(expected_version)
            try:
                new = apply_patch(current, self.static, changes)
            except ValueError as exc:
                raise ChangeError.invalid(exc) from None
            return await self._install(current, new, actor, source, reason, lane_moves,
                                       dry_run)

    async def apply_profile(self, name: str, *, actor: str, reason: str = "",
                            expected_version: int | None = None,
                            lane_moves: dict[str, str] | None = None,
                            dry_run: bool = False) -> ChangeResult:
        if name not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none are defined in the YAML"
            raise ChangeError(404, "unknown_profile", f"no profile {name!r}; profiles: {known}")
        return await self.patch(self.profiles[name], expected_version=expected_version,
                                actor=actor, source=f"profile:{name}", reason=reason,
                                lane_moves=lane_moves, dry_run=dry_run)

    async def rollback(self, version: int, *, actor: str, reason: str = "",
                       expected_version: int | None = None,
                       lane_moves: dict[str, str] | None = None,
                       dry_run: bool = False) -> ChangeResult:
        """Install the settings of an earlier version, as a new version."""
        self.current()
        target = next((v for v in self.history if v.version == version), None)
        if target is None:
            known = [v.version for v in self.history]
            span = f"{known[0]}..{known[-1]}" if known else "none"
            raise ChangeError(404, "unknown_version", f"no version {version} in the history"
                              f" (kept: {span})")
        async with self._lock:
            current = self._check_version(expected_version)
            new = target.live.replace(version=current.version)
            return await self._install(current, new, actor, f"rollback:{version}", reason,
                                       lane_moves, dry_run)

    async def install_fleet(self, config: dict[str, Any], fleet_version: int, *, actor: str,
                            source: str, reason: str = "",
                            lane_moves: dict[str, str] | None = None,
                            dry_run: bool = False) -> ChangeResult:
        """Install the fleet's whole live config (`live_to_dict` form) as fleet version
        `fleet_version`: idempotent, whatever this replica ran before (a restarted replica,
        a canary going back). The version is stamped even when no setting changes."""
        async with self._lock:
            current = self.current()
            try:
                new = live_from_dict(config).replace(version=current.version)
                new.validate(self.static)
            except (ValueError, TypeError) as exc:
                raise ChangeError.invalid(exc) from None
            result = await self._install(current, new, actor, source, reason, lane_moves,
                                         dry_run, fleet_version)
            if not dry_run and not result.applied and self.fleet_version != fleet_version:
                await self.engine.call(lambda e: setattr(self, "fleet_version", fleet_version))
            return result

    def audit_event(self, source: str, actor: str, change: dict[str, Any], note: str) -> None:
        """A control decision that is not a config version (a canary's verdict and its
        evidence): one config_changes row in this replica's trace, and the log."""
        live = self.engine.live_config
        log.warning("%s by %s: %s", source, actor, note)
        if self.writer is not None:
            self.writer.submit_config_change(time.time(), live.version if live else 0, source,
                                             actor, change, note)

    def audit_admission(self, paused: bool, actor: str, reason: str) -> None:
        """Drain / resume: not a config version, but a decision a postmortem must see."""
        live = self.engine.live_config
        version = live.version if live is not None else 0
        change = {"admission": ["open" if paused else "paused", "paused" if paused else "open"]}
        log.warning("admission %s by %s: %s", "paused" if paused else "resumed", actor,
                    reason or "(no reason given)")
        if self.writer is not None:
            self.writer.submit_config_change(time.time(), version,
                                             "drain" if paused else "resume", actor, change,
                                             reason)

    # ---- internals -----------------------------------------------------------------
    def _check_version(self, expected: int | None) -> LiveConfig:
        current = self.current()
        if expected is not None and expected != current.version:
            raise ChangeError(412, "version_mismatch", f"the config is at version"
                              f" {current.version}, not {expected}: someone changed it;"
                              " read it again and retry", current_version=current.version)
        return current

    async def _install(self, current: LiveConfig, new: LiveConfig, actor: str, source: str,
                       reason: str, lane_moves: dict[str, str] | None,
                       dry_run: bool, fleet_version: int | None = None) -> ChangeResult:
        changes = diff(current, new)
        moves = dict(lane_moves or {})

        def install(e: Any) -> LiveConfig:  # on the engine thread, between two steps
            installed = e.update_config(new, moves)
            if fleet_version is not None:
                self.fleet_version = fleet_version
            return installed

        try:
            if dry_run or not changes:
                await self.engine.call(lambda e: e.check_lane_moves(new, moves))
                return ChangeResult(False, current.version, changes, new)
            installed = await self.engine.call(install)
        except LaneNotEmptyError as exc:
            raise ChangeError(409, "lane_not_empty", str(exc)) from None
        except ValueError as exc:
            raise ChangeError.invalid(exc) from None
        self._record(ConfigVersion(installed.version, time.time(), actor, source, reason,
                                   changes, installed))
        log.warning("config version %d by %s (%s): %s%s", installed.version, actor, source,
                    ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()),
                    f"; reason: {reason}" if reason else "")
        return ChangeResult(True, installed.version, changes, installed)

    def _record(self, entry: ConfigVersion) -> None:
        self.history.append(entry)
        del self.history[:-HISTORY_LIMIT]
        if self.writer is not None:
            self.writer.submit_config_change(entry.time, entry.version, entry.source,
                                             entry.actor, entry.diff, entry.reason)
