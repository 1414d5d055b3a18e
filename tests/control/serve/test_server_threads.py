"""How many intra-op threads `batchpilot serve` gives torch on a CPU
(control/serve/bootstrap.py): every core on one or two, all but one on more, and never
against an OMP_NUM_THREADS the operator set."""

from __future__ import annotations

import pytest
import torch

from control.serve import bootstrap
from control.serve.bootstrap import build_parts, server_torch_threads
from control.serve.settings import ServeSettings


def test_two_cores_both_go_to_the_steps_and_more_leave_one():
    assert [server_torch_threads(n) for n in (1, 2, 3, 16)] == [1, 2, 2, 15]


@pytest.mark.parametrize(("cpus", "omp", "expected"), [(2, None, [2]), (8, None, [7]),
                                                       (2, "1", [])])
def test_the_server_sets_them_before_loading(tiny_llama_dir, monkeypatch, cpus, omp, expected):
    asked = []
    monkeypatch.setattr(bootstrap.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(torch, "set_num_threads", asked.append)  # the test's own stay
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    build_parts(ServeSettings(model=str(tiny_llama_dir), device="cpu"))
    assert asked == expected
