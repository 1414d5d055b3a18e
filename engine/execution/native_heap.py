"""glibc's malloc told to keep the memory a step frees for the next step.

torch takes a CPU tensor's memory from malloc. glibc serves a request above its mmap
threshold (128 KiB at start, raised as larger blocks are freed) with a fresh mapping, and
hands the top of its heap back to the kernel once more than its trim threshold lies free
there. A step's temporaries (a 64-row decode step's activations are 150 KiB-1 MiB each, a
2,048-token prefill's up to 25 MB) then come back as fresh pages every step, and the first
touch of each 4 KiB pays a page fault and the kernel's zeroing.

Measured (`python -m bench.malloc_tuning`, SmolLM2, one LLM serving the offline workload's
64 requests again and again, as a server does): tens of thousands of minor page faults a
run without this, a few hundred with it, at the same peak RSS. The thresholds below keep
freed blocks up to 64 MiB in the heap and up to 512 MiB free at its top; the KV cache and
the weights, allocated once, still get mappings of their own.

The setting is process-wide and stays (glibc cannot report the values it replaces), as an
LD_PRELOADed tcmalloc or jemalloc would be; BATCHPILOT_MALLOC_TUNING=0 leaves malloc as it
is. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

ENV_VAR = "BATCHPILOT_MALLOC_TUNING"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 64 << 20
TRIM_THRESHOLD_BYTES = 512 << 20

_applied: bool | None = None  # the outcome of the first call, for the life of the process


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; True where they are set (now or before)."""
    global _applied
    if _applied is None:
        _applied = _set_thresholds()
    return _applied


def _set_thresholds() -> bool:
    if os.environ.get(ENV_VAR, "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = ctypes.CDLL(name).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; setting either threshold turns glibc's dynamic
    # adjustment of both off
    return (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
