"""Row argmax of float32 CPU rows in one native call (kernels/cpu_argmax.c), for the
sampler's greedy rows and the exponential race (engine/execution/exponential_race.py).

torch.max(dim=-1) over a decode step's logits ([64, 49152] float32, 2 threads) took
1.38 ms, against 0.24 ms here (0.11 / 0.68 at 32 rows, 0.014 / 0.17 at 8): ~5% of a
64-decode step on this CPU. The result is torch.argmax's, index for index (ties, NaN,
rows of -inf: tests/kernels/test_cpu_argmax.py).
"""

from __future__ import annotations

import torch

from kernels import native_library

# False: torch.max always (A/B runs, tests of the torch path).
NATIVE_ARGMAX = True
PARALLEL_MIN_ELEMENTS = 32768  # below, one thread: waking the second costs more


def takes(values: torch.Tensor) -> bool:
    """Whether the native call takes these rows: float32 [R, V] (V >= 1), contiguous, CPU,
    NATIVE_ARGMAX on and the library built here."""
    return (NATIVE_ARGMAX and values.dim() == 2 and values.dtype == torch.float32
            and values.device.type == "cpu" and values.shape[1] > 0 and values.is_contiguous()
            and native_library.load() is not None)


def row_argmax(values: torch.Tensor) -> torch.Tensor:
    """int64 [R]: each row's argmax (takes(values) must hold)."""
    rows, width = values.shape
    out = torch.empty(rows, dtype=torch.int64)
    if rows:
        threads = 1 if values.numel() < PARALLEL_MIN_ELEMENTS else torch.get_num_threads()
        status = native_library.load().bp_row_argmax(values.data_ptr(), rows, width,
                                                     out.data_ptr(), threads)
        if status != 0:
            raise ValueError(f"rows of {width} values: the native argmax takes 1 or more")
    return out
