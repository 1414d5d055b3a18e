"""The checklist file (playbooks/checklist.yaml): sections of items, each naming the
check that decides it and the check's parameters. Loaded and validated once; every error
names the item and the field, so a bad file is fixed in one go.

    sections:
      - id: capacity_and_configuration
        title: Capacity and configuration
        items:
          - id: watermarks
            title: KV watermarks set and ordered
            why: new prefills stop before requests are rejected
            check: watermarks_ordered
            params: {min_gap: 0.02}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from control.checklist.catalog import CHECKS
from control.checklist.result import ChecklistError
from engine.config.known_keys import did_you_mean

DEFAULT_SPEC = Path(__file__).resolve().parents[2] / "playbooks" / "checklist.yaml"
SECTION_KEYS = {"id", "title", "items"}
ITEM_KEYS = {"id", "title", "why", "check", "params"}


@dataclass(frozen=True)
class Item:
    id: str
    title: str
    why: str
    check: str
    params: dict[str, Any]  # the check's defaults with the spec's values over them


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Spec:
    name: str
    sections: tuple[Section, ...]

    def param(self, check: str, key: str, default: Any = None) -> Any:
        """The parameter of the first item using `check` (default if none does)."""
        for section in self.sections:
            for item in section.items:
                if item.check == check:
                    return item.params.get(key, default)
        return default


def load_spec(path: str | Path = DEFAULT_SPEC) -> Spec:
    """Read and validate a checklist file; ChecklistError names what is wrong."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ChecklistError(f"checklist spec {str(path)!r} cannot be read: {exc.strerror}"
                             ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ChecklistError(f"checklist spec {str(path)!r} is not valid YAML: {problem}{at}"
                             ) from None
    try:
        return parse_spec(data)
    except ValueError as exc:
        raise ChecklistError(f"checklist spec {str(path)!r}: {exc}") from None


def parse_spec(data: Any) -> Spec:
    """A spec from its parsed YAML; ValueError naming the item and field."""
    if not isinstance(data, dict) or not isinstance(data.get("sections"), list) \
            or not data["sections"]:
        raise ValueError("must be a mapping with a non-empty 'sections' list")
    _no_unknown("the file", data, {"name", "description", "sections"})
    seen: set[str] = set()
    sections = []
    for i, raw in enumerate(data["sections"]):
        where = f"sections[{i}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{where} must be a mapping with id, title and items")
        _no_unknown(where, raw, SECTION_KEYS)
        sid, title = _text(where, raw, "id"), _text(where, raw, "title")
        where = f"section {sid!r}"
        if not isinstance(raw.get("items"), list) or not raw["items"]:
            raise ValueError(f"{where}: items must be a non-empty list")
        items = tuple(_item(f"{where} items[{j}]", entry, seen)
                      for j, entry in enumerate(raw["items"]))
        sections.append(Section(sid, title, items))
    return Spec(str(data.get("name") or "go-live checklist"), tuple(sections))


def _item(where: str, raw: Any, seen: set[str]) -> Item:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a mapping with id, title, why, check, params")
    item_id = _text(where, raw, "id")
    where = f"item {item_id!r}"
    _no_unknown(where, raw, ITEM_KEYS)
    if item_id in seen:
        raise ValueError(f"{where}: the id is used twice")
    seen.add(item_id)
    name = _text(where, raw, "check")
    if name not in CHECKS:
        raise ValueError(f"{where}: check {name!r} is not a check; checks: "
                         f"{', '.join(sorted(CHECKS))}")
    given = raw.get("params") or {}
    if not isinstance(given, dict):
        raise ValueError(f"{where}: params must be a mapping")
    check = CHECKS[name]
    for key, value in given.items():
        if key not in check.defaults:
            takes = ", ".join(sorted(check.defaults)) or "no parameters"
            raise ValueError(f"{where}: params.{key} is not a parameter of check {name!r}"
                             f" (it takes: {takes})")
        if value is None and key in check.nullable:
            continue
        _check_type(f"{where}: params.{key}", value,
                    check.nullable.get(key, type(check.defaults[key])))
        if key in check.choices and value not in check.choices[key]:
            raise ValueError(f"{where}: params.{key}={value!r} must be one of"
                             f" {', '.join(check.choices[key])}")
    return Item(item_id, _text(where, raw, "title"), _text(where, raw, "why"), name,
                {**check.defaults, **given})


def _text(where: str, raw: dict[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key} must be a non-empty string (got {value!r})")
    return value.strip()


def _no_unknown(where: str, raw: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}{did_you_mean(unknown, allowed)};"
                         f" allowed: {sorted(allowed)}")


def _check_type(where: str, value: Any, kind: type) -> None:
    """A value must have its parameter's type (an int does for a float)."""
    if kind is bool:
        ok, text = isinstance(value, bool), "true or false"
    elif kind in (int, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        text = "a number"
    else:
        ok = isinstance(value, kind)
        text = {list: "a list", dict: "a mapping", str: "a string"}.get(kind, kind.__name__)
    if not ok:
        raise ValueError(f"{where}={value!r} must be {text}")
