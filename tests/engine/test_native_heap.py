"""engine/execution/native_heap.py: freed step temporaries come back without page faults.

Each case runs in a fresh interpreter (the setting is process-wide and permanent): a 16 MiB
tensor is filled and freed, then a 15 MiB one filled; the second fill's minor page faults
are counted. Left to glibc's defaults the first went back to the kernel and every 4 KiB of
the second faults (about 3,800 of them); with the thresholds set the freed block is reused. (A
second block of exactly the same size does not always fit the first's place: torch asks
for 64-byte alignment, and glibc's aligned allocation wants a little more than the block,
so then it grows the heap instead, as 2 of 6 runs did here.)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from engine.execution import native_heap

PROBE = """
import json, resource, torch
from engine.execution import native_heap
applied = native_heap.keep_freed_memory() if {tune} else False
torch.empty(4 << 20).fill_(1.0)  # 16 MiB, freed at once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(15 << 18).fill_(2.0)  # 15 MiB: fits the freed block wherever it lies
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({{"applied": applied, "faults": faults}}))
"""


def require_glibc() -> None:
    """mallopt's thresholds are glibc's: elsewhere skip, but under CI (a Debian machine
    like the one `make test` set up) a missing glibc is a broken set-up, so fail."""
    if platform.libc_ver()[0] == "glibc":
        return
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true: this interpreter does not run on glibc", pytrace=False)
    pytest.skip("mallopt's thresholds are glibc's")


def _probe(tune: bool, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE.format(tune=tune)],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, **(env or {})})
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_freed_block_is_reused_without_faults():
    require_glibc()
    untuned, tuned = _probe(False), _probe(True)
    assert untuned["faults"] >= 2000, untuned  # a fresh mapping: a fault per 4 KiB page
    assert tuned["applied"] and tuned["faults"] < 200, tuned


def test_the_environment_can_leave_malloc_alone():
    require_glibc()
    left = _probe(True, {native_heap.ENV_VAR: "0"})
    assert not left["applied"] and left["faults"] >= 2000, left


def test_both_thresholds_are_set(monkeypatch):
    """The mmap threshold alone keeps a freed block; without the trim threshold glibc still
    hands the heap's free top back to the kernel, and the next step faults it in again."""
    calls = []

    def mallopt(option, value):
        calls.append((option, value))
        return 1

    monkeypatch.setattr(native_heap.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(native_heap.ctypes.util, "find_library", lambda name: "libc.so.6")
    monkeypatch.setattr(native_heap.ctypes, "CDLL", lambda name: SimpleNamespace(mallopt=mallopt))
    monkeypatch.delenv(native_heap.ENV_VAR, raising=False)
    assert native_heap._set_thresholds()
    assert sorted(calls) == sorted([
        (native_heap.M_MMAP_THRESHOLD, native_heap.MMAP_THRESHOLD_BYTES),
        (native_heap.M_TRIM_THRESHOLD, native_heap.TRIM_THRESHOLD_BYTES)])


def test_a_cpu_runner_asks_for_it(tiny_llama_dir):
    from engine.execution.model_runner import ModelRunner
    from engine.models import load_model

    loaded = load_model(str(tiny_llama_dir), dtype=torch.float32)
    with mock.patch.object(native_heap, "keep_freed_memory") as keep:
        ModelRunner(loaded, 8, 16)
    keep.assert_called_once_with()
