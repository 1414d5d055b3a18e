"""Engine-core tests run without a model: the simulated executor and a fake clock.

Shared helpers live in `engine_helpers.py` (plain functions, so hypothesis tests can use
them without function-scoped fixtures); this file puts that module on the import path
whatever pytest's import mode is.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
