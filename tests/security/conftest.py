"""Hostile-client tests: the tiny random-weight Llama behind the real app
(tests/fixtures/serving.py), with one torch thread per test module (see `one_torch_thread`
in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    yield
