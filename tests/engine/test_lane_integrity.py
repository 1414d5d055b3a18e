"""`Engine.check_integrity()` recounts the lanes' derived counters and the running set
from the requests themselves, and names what drifted (issue 17.12).

The random workloads call it after every step (through `Driver.step`); here each counter
is corrupted in turn and the check must name the lane, the counter, expected and actual.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt

from engine.config import LaneConfig
from engine.errors import SchedulerInvariantError
from engine.lanes.integrity import LaneIntegrityError
from engine.request import SamplingParams

LANES = (LaneConfig("fair", tenant_fair_share=True, max_running=2), LaneConfig("plain"))
LONG = SamplingParams(max_tokens=100, ignore_eos=True)


def _busy_engine():
    """Two running and decoding in `fair` (tenants a, b), two queued there (a, c), one
    running in `plain`."""
    live = live_config(LANES, max_num_seqs=8, max_num_batched_tokens=256, prefill_chunk_size=64)
    engine, _ = make_engine(live, max_model_len=512)
    d = Driver(engine)
    d.add("a1", prompt(1, 8), LONG, lane="fair", tenant="a")
    d.add("b1", prompt(2, 8), LONG, lane="fair", tenant="b")
    d.add("p1", prompt(3, 8), LONG, lane="plain", tenant="a")
    d.step()
    d.add("a2", prompt(4, 8), LONG, lane="fair", tenant="a")
    d.add("c1", prompt(5, 8), LONG, lane="fair", tenant="c")
    d.step()  # checks integrity: the healthy state passes
    return engine


def _corrupt(engine, what: str) -> None:
    sched = engine.scheduler
    fair, plain = sched.lanes["fair"], sched.lanes["plain"]
    if what == "num_waiting":
        fair.num_waiting += 1
    elif what == "waiting_tokens":
        fair.waiting_tokens -= 3
    elif what == "num_running":
        plain.num_running = 0
    elif what == "num_decoding":
        fair.num_decoding += 1
    elif what == "waiting by tenant":
        fair.tenants.waiting["c"] = 2
    elif what == "running by tenant":
        fair.tenants.running["z"] = 1
    elif what == "decoding by tenant":
        del fair.tenants.decoding["b"]
    elif what == "virtual times of tenants with nothing queued or running":
        fair.tenants.vtimes["gone"] = 5.0
    elif what == "buckets":
        fair.buckets()["zombie"] = []
    elif what == "queued requests by bucket":
        fair.buckets().pop("c")
    elif what == "queue timeout":
        fair.timeouts.clear()
    elif what == "running set":
        sched.running.remove(engine.requests["p1"])
    elif what == "running set twice":
        sched.running.append(engine.requests["a1"])
    else:
        raise AssertionError(what)


@pytest.mark.parametrize(("what", "message"), [
    ("num_waiting", r"lane 'fair': num_waiting is 3, but the requests give 2"),
    ("waiting_tokens", r"lane 'fair': waiting_tokens is 13, but the requests give 16"),
    ("num_running", r"lane 'plain': num_running is 0, but the requests give 1"),
    ("num_decoding", r"lane 'fair': num_decoding is 3, but the requests give 2"),
    ("waiting by tenant", r"lane 'fair': waiting by tenant is \{'a': 1, 'c': 2\}, but the"
                          r" requests give \{'a': 1, 'c': 1\}"),
    ("running by tenant", r"lane 'fair': running by tenant is .*'z': 1.*, but"),
    ("decoding by tenant", r"lane 'fair': decoding by tenant is \{'a': 1\}, but the requests"
                           r" give \{'a': 1, 'b': 1\}"),
    ("virtual times of tenants with nothing queued or running",
     r"lane 'fair': virtual times of tenants with nothing queued or running is \['gone'\]"),
    ("buckets", r"lane 'fair': buckets is \['a', 'c', 'zombie'\], but the requests give"
                r" \['a', 'c'\]"),
    ("queued requests by bucket", r"lane 'fair': queued requests by bucket is \{'a': 1\}"),
    ("queue timeout", r"lane 'fair': request 'a2' is queued, never scheduled, and not tracked"
                      r" for its queue timeout"),
    ("running set", r"running set, request 'p1': entries is 0, but the requests give 1"),
    ("running set twice", r"running set, request 'a1': entries is 2, but the requests give 1"),
])
def test_check_integrity_names_the_counter_that_drifted(what, message):
    engine = _busy_engine()
    _corrupt(engine, what)
    with pytest.raises(LaneIntegrityError, match=message):
        engine.check_integrity()


def test_the_lane_check_is_a_scheduler_invariant_error_that_survives_python_O():
    assert issubclass(LaneIntegrityError, SchedulerInvariantError)
    code = (
        "import sys\nsys.path.insert(0, 'tests/engine')\n"
        "from test_lane_integrity import _busy_engine, _corrupt\n"
        "from engine.lanes.integrity import LaneIntegrityError\n"
        "e = _busy_engine()\n_corrupt(e, 'num_waiting')\n"
        "try:\n    e.check_integrity()\nexcept LaneIntegrityError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert "num_waiting is 3, but the requests give 2" in out.stdout, out.stderr
