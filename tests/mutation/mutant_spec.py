"""What one planted bug of `make mutants` is (tests/mutation/mutants.py), for the lists that name
them (tests/mutation/mutant_list.py and the area lists it gathers)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str  # found exactly once in `path`
    new: str
    tests: tuple[str, ...]  # pytest node ids or files; one of them must fail
    why: str  # what the bug would do to a user


SEC = "tests/security/"
ENG = "tests/engine/"
CTL = "tests/control/"
KRN = "tests/kernels/"
MDL = "tests/models/"
