"""The type each engine config field's value must have, checked field by field: for the
YAML loader (engine/config/yaml_loader.py) and for settings given in code (LLM(...)
keyword arguments). No YAML here: the offline engine imports it without PyYAML's C
extension (which brings Cython's runtime modules the GPU machine's check does not know)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from engine.config.schema import LaneConfig, LiveConfig, StaticConfig


def check_field_types(values: dict[str, Any], where: str = "",
                      types: dict[str, tuple[type, bool]] | None = None) -> None:
    """ValueError naming the first field of `values` (`where` + its name) whose value has
    the wrong type for `types` (FIELD_TYPES, the engine config's static and live fields, by
    default; LANE_FIELD_TYPES for a lane): a str, a float or a bool would pass the range
    checks or fail inside them with a TypeError. The YAML loader's check, and LLM(...)'s
    for its keyword arguments."""
    types = FIELD_TYPES if types is None else types
    for key, value in values.items():
        _check_type(f"{where}{key}", key, value, types)


def _check_type(where: str, key: str, value: Any,
               types: dict[str, tuple[type, bool]]) -> None:
    expected, nullable = types.get(key, (object, True))
    if value is None:
        if nullable:
            return
        raise ValueError(f"{where}=None must be of type {expected.__name__} (null is not allowed)")
    if isinstance(value, bool) and expected in (int, float):  # bool is an int to Python
        raise ValueError(f"{where}={value!r} must be "
                         + ("an integer" if expected is int else "of type float"))
    # numbers.Integral / Real: a numpy integer from code is a whole number too
    if expected is float and isinstance(value, numbers.Real):
        return
    if expected is int and isinstance(value, numbers.Integral):
        return
    if not isinstance(value, expected):
        raise ValueError(f"{where}={value!r} must be of type {expected.__name__}")


def field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name -> (type a value must have, whether null is allowed)."""
    types = {"int": int, "float": float, "bool": bool, "str": str}
    return {f.name: (types.get(str(f.type).split(" ")[0], object), "None" in str(f.type))
            for f in dataclasses.fields(cls)}


FIELD_TYPES = {**field_types(StaticConfig), **field_types(LiveConfig)}  # serving, profiles
LANE_FIELD_TYPES = field_types(LaneConfig)
