"""bench.whatif_accuracy predicts the faster run at the rate the server saw: the ratio of the
two windows' mean arrival gaps (the smoke's 6 requests cannot check it end to end)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.whatif_accuracy import rate_scale_of


def _window(arrivals: list[float]) -> SimpleNamespace:
    return SimpleNamespace(requests=[SimpleNamespace(arrival_time=t) for t in arrivals])


def test_the_rate_scale_is_the_ratio_of_mean_gaps_whatever_the_order():
    recorded = _window([10.0, 13.0, 16.0, 19.0])  # 3 s apart
    faster = _window([102.0, 100.0, 104.0])  # 2 s apart, out of order
    assert rate_scale_of(recorded, faster) == pytest.approx(1.5)
    assert rate_scale_of(faster, recorded) == pytest.approx(2 / 3)
