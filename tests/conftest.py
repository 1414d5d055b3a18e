"""Import paths for every test directory.

tests/ goes on sys.path so shared helpers import as `fixtures.*`. The repository root goes
in front of it: otherwise, when pytest runs without the root on sys.path, the directory
tests/kernels would shadow the real `kernels` package as a namespace package.
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS_DIR = Path(__file__).resolve().parent
for _path in (str(_TESTS_DIR), str(_TESTS_DIR.parent)):  # the root ends up first
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)
