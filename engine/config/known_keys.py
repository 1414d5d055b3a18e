"""Refusing unknown keys in a config mapping (the serving YAML, its lanes and SLOs, live
patches, load-test scenarios, checklist specs), with the closest known key named: a typo
or a setting written one level too high is the usual cause, and the list of every allowed
key does not say which one was meant."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any

CLOSE_ENOUGH = 0.8  # difflib's ratio: one wrong, missing or extra letter in a 10-letter key


def check_known_keys(where: str, block: Mapping[Any, Any], allowed: Collection[str],
                     nested: Mapping[str, Collection[str]] | None = None) -> None:
    """ValueError naming the keys of `block` not in `allowed`, the closest known keys and
    every allowed one. `nested`: blocks inside this one ({name: their keys}), where an
    unknown key here may belong (a serving setting written at the top level)."""
    unknown = sorted(map(str, set(block) - set(allowed)))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in '{where}'"
                         f"{did_you_mean(unknown, allowed, nested)}; allowed: {sorted(allowed)}")


def did_you_mean(unknown: list[str], allowed: Collection[str],
                 nested: Mapping[str, Collection[str]] | None = None) -> str:
    """' (did you mean ...?)' naming, for each unknown key, the known key closest to it:
    one of `allowed`, or inside a nested block by its path; '' when none is close."""
    paths = {key: key for key in allowed}
    for block, keys in (nested or {}).items():
        paths.update({key: f"{block}.{key}" for key in keys if key not in paths})
    tips = []
    for key in unknown:
        close = difflib.get_close_matches(key, list(paths), n=1, cutoff=CLOSE_ENOUGH)
        if close:
            tips.append(paths[close[0]] if len(unknown) == 1 else f"{paths[close[0]]} for {key}")
    return f" (did you mean {', '.join(tips)}?)" if tips else ""
