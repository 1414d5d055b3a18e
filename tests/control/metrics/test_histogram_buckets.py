"""The lock-free histograms (control/metrics/core.py) count a sample in the first bucket
whose bound it does not exceed, as Prometheus defines `le`: a value equal to a bound is in
that bound's bucket, for single samples and for a request's inter-token gaps alike."""

from __future__ import annotations

from control.metrics.core import Histogram


def buckets(hist: Histogram) -> dict[str, float]:
    (family,) = [hist.family()]
    return {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}


def test_a_sample_on_a_bound_is_in_that_bounds_bucket():
    hist = Histogram("x_seconds", "doc", ("model",), (0.1, 1.0))
    for value in (0.1, 0.5, 1.0, 2.0):
        hist.labels("m").observe(value)
    assert buckets(hist) == {"0.1": 1, "1.0": 3, "+Inf": 4}


def test_inter_token_gaps_on_a_bound_too():
    hist = Histogram("itl_seconds", "doc", ("model",), (0.25, 1.0))
    hist.labels("m").observe_gaps((0.0, 0.25, 1.25, 3.25))  # gaps 0.25, 1.0, 2.0
    assert buckets(hist) == {"0.25": 1, "1.0": 2, "+Inf": 3}


def test_the_inter_token_sum_is_the_first_to_last_token_time():
    """The gaps' sum (a mean inter-token latency is _sum / _count): every gap once."""
    hist = Histogram("itl_seconds", "doc", ("model",), (0.25, 1.0))
    hist.labels("m").observe_gaps((10.0, 10.25, 11.25, 13.25))
    hist.labels("m").observe_gaps((20.0, 20.5))
    (family,) = [hist.family()]
    got = {s.name: s.value for s in family.samples if not s.name.endswith("_bucket")}
    assert got == {"itl_seconds_count": 4, "itl_seconds_sum": 3.75}
