"""The check functions by name, with the parameters each takes (and their defaults), and
the helpers they share to read the evidence.

    @register("watermarks_ordered", min_gap=0.02)
    def watermarks_ordered(ev: Evidence, p: dict) -> Verdict: ...

A spec item names its check and may override its parameters; an unknown parameter, or one
of the wrong type, is an error when the spec is loaded (control/checklist/spec.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from control.checklist.result import Verdict, needs

if TYPE_CHECKING:
    from control.checklist.evidence import Evidence

CheckFn = Callable[["Evidence", dict[str, Any]], Verdict]


@dataclass(frozen=True)
class Check:
    name: str
    fn: CheckFn
    defaults: dict[str, Any]  # every parameter it takes -> its default
    nullable: dict[str, type]  # parameters that may be null (off) -> the type otherwise
    choices: dict[str, tuple[str, ...]]  # string parameters -> the values they may take


CHECKS: dict[str, Check] = {}


def register(name: str, nullable: dict[str, type] | None = None,
             choices: dict[str, tuple[str, ...]] | None = None,
             **defaults: Any) -> Callable[[CheckFn], CheckFn]:
    def add(fn: CheckFn) -> CheckFn:
        assert name not in CHECKS, f"check {name!r} registered twice"
        CHECKS[name] = Check(name, fn, defaults, nullable or {}, choices or {})
        return fn
    return add


# ---- reading the config evidence -------------------------------------------------------
def lookup(ev: Evidence, *keys: str) -> tuple[dict[str, Any], list[str]]:
    """Dotted keys into the live config ('static.' prefix: the static config) -> (values
    found, keys missing). A key is missing when its value is not known (file mode)."""
    found, missing = {}, []
    for key in keys:
        node: Any = ev.static if key.startswith("static.") else ev.config
        for part in key.removeprefix("static.").split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is _MISSING:
            missing.append(key)
        else:
            found[key] = node
    return found, missing


_MISSING = object()


def config_missing(ev: Evidence, missing: list[str]) -> Verdict:
    """needs-evidence naming the settings not known, and where the config came from."""
    where = ev.config_from or ev.missing.get("config", "no config was read")
    return needs(f"not known: {', '.join(missing)} ({where}); run with --url against the"
                 " server for its live config", missing=missing)


def fmt(value: Any) -> str:
    """A number for an evidence string: 0.95, 8192, 1.23 s-free, None as 'unset'."""
    if value is None:
        return "unset"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
