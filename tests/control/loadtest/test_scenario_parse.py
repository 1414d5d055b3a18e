"""Edges of a scenario file's validation (control/loadtest/scenario_parse.py): what a
person writes that must load, and what must be refused with the field named."""

from __future__ import annotations

import pytest
from fixtures.loadtest import small_scenario

from control.loadtest.scenario import plan


def test_a_uniform_dist_with_min_equal_to_max_is_a_fixed_length():
    scenario = small_scenario(prompt={"dist": "uniform", "min": 64, "max": 64})
    assert {r.prompt_tokens for r in plan(scenario)} == {64}


@pytest.mark.parametrize("key", ["requests", "concurrency", "seed"])
def test_true_is_not_a_count(key):
    """YAML's `yes`/`true` where a whole number belongs is refused, not read as 1."""
    with pytest.raises(ValueError, match=rf"^test.yaml: {key}=True must be an integer"):
        small_scenario(**{key: True})


@pytest.mark.parametrize("block", ["tenants", "lanes"])
def test_weights_that_are_all_zero_are_refused(block):
    """Every weight 0 would plan no tenant (or lane) to draw from."""
    with pytest.raises(ValueError, match=rf"^test.yaml: {block}: at least one weight"):
        small_scenario(**{block: {"a": 0, "b": 0.0}})


def test_a_lognormal_of_mean_zero_is_refused():
    with pytest.raises(ValueError, match=r"^test.yaml: prompt.mean=0 must be > 0"):
        small_scenario(prompt={"dist": "lognormal", "mean": 0, "sigma": 0.5})
