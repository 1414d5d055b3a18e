"""A library the project installs is never a silent skip under CI (tests/fixtures/requires.py)."""

from __future__ import annotations

import pytest
from fixtures.requires import require_module

MISSING = "batchpilot_no_such_module"


def test_a_missing_library_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match=f"CI without {MISSING}.*pip install x"):
        require_module(MISSING, "pip install x")


def test_a_missing_library_skips_outside_ci_saying_how_to_install_it(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="pip install x"):
        require_module(MISSING, "pip install x")


def test_a_present_library_is_the_module(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require_module("json", "-").dumps([1]) == "[1]"
