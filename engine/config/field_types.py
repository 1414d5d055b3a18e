"""The type each config dataclass field's value must have, checked field by field: by the
YAML loader (engine/config/yaml_loader.py) before it builds a config, by LLM(...) for its
keyword arguments, and by the configs' own validate() (engine/config/schema.py) for one
built in code. Nothing of the engine's imported here (schema.py imports this), and no YAML:
the offline engine imports it without PyYAML's C extension (which brings Cython's runtime
modules the GPU machine's check does not know)."""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Any


def check_field_types(values: dict[str, Any], where: str,
                      types: dict[str, tuple[type, bool]]) -> None:
    """ValueError naming the first field of `values` (`where` + its name) whose value has
    the wrong type for `types` (schema.py's FIELD_TYPES, the engine config's static and live
    fields; LANE_FIELD_TYPES for a lane): a str, a float or a bool would pass the range
    checks or fail inside them with a TypeError."""
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


def check_dataclass_types(config: Any, where: str = "") -> None:
    """check_field_types over every field of the dataclass instance `config`: a config built
    in code (LiveConfig(max_num_seqs="64")) is refused as its YAML would be."""
    types = field_types(type(config))
    check_field_types({name: getattr(config, name) for name in types}, where, types)


@functools.cache
def field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name -> (type a value must have, whether null is allowed), from the dataclass's
    annotations as written ("int", "str | None"; any other annotation is not checked here)."""
    types = {"int": int, "float": float, "bool": bool, "str": str}
    return {f.name: (types.get(str(f.type).split(" ")[0], object), "None" in str(f.type))
            for f in dataclasses.fields(cls)}
