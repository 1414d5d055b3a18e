"""The `dtype` option's values, without torch (the CLI and settings check it before any
model code is imported). What each value does: engine/models/cpu_dtype.py."""

from __future__ import annotations

DTYPE_CHOICES = ("auto", "float32", "bfloat16")
_ALIASES = {"fp32": "float32", "bf16": "bfloat16"}


def parse_dtype_choice(value: str | None) -> str:
    """"auto" for None, else one of DTYPE_CHOICES (fp32 / bf16 accepted, any case);
    ValueError naming the choices otherwise."""
    if value is None:
        return "auto"
    choice = str(value).lower()
    choice = _ALIASES.get(choice, choice)
    if choice not in DTYPE_CHOICES:
        raise ValueError(f"dtype={value!r} must be one of {', '.join(DTYPE_CHOICES)}")
    return choice
