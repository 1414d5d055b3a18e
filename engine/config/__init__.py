"""The engine's configuration: the static and live schema (`schema.py`: frozen, validated
dataclasses), loading it from YAML or a dict (`yaml_loader.py`), live changes as JSON merge
patches and diffs (`patch.py`), lanes' service-level objectives (`slo.py`), and the `dtype`
option's values (`dtype_option.py`, no torch). It owns no state: a `LiveConfig` is an
immutable, versioned snapshot that the scheduler reads once per step. It may import nothing
else of the engine (PyYAML and the standard library only), so every other part can import it.
"""

from __future__ import annotations

from engine.config.schema import EngineConfig, LaneConfig, LiveConfig, StaticConfig
from engine.config.slo import LaneSLO

__all__ = ["EngineConfig", "LaneConfig", "LaneSLO", "LiveConfig", "StaticConfig"]
