"""`make mutants`' list (tests/mutation/mutant_list.py) stays current: each piece it replaces is in
its file exactly once, each test it names exists, and the names are unique. (Planting
them is `make mutants`, minutes; this is the part that can rot silently.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mutant_list import MUTANTS

ROOT = Path(__file__).resolve().parents[2]


def test_names_are_unique_and_each_says_why():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(m.why and m.tests and m.old != m.new for m in MUTANTS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_piece_is_in_its_file_once_and_its_tests_exist(mutant):
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.path} holds the piece {text.count(mutant.old)}x"
    for test in mutant.tests:
        path, _, name = test.partition("::")
        source = (ROOT / path).read_text()
        if name:
            assert re.search(rf"^(async )?def {re.escape(name)}\(", source, re.M), test
