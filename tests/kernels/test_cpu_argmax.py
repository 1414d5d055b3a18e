"""kernels/cpu_argmax.c is torch.argmax(dim=-1), index for index: ties, NaN anywhere (the
first one), rows of -inf, +-inf, -0.0 beside 0.0, widths around its 16- and 64-lane steps,
one thread and two. It runs wherever the library builds (every CI machine)."""

from __future__ import annotations

import pytest
import torch

from engine.execution import exponential_race
from kernels import cpu_argmax, native_library


def _native(values: torch.Tensor) -> torch.Tensor:
    assert cpu_argmax.takes(values), native_library.unavailable_reason()
    return cpu_argmax.row_argmax(values)


@pytest.mark.parametrize("width", [1, 15, 16, 17, 63, 64, 65, 129, 3001, 49152])
@pytest.mark.parametrize("seed", range(3))
def test_native_argmax_is_torch_argmax(width, seed):
    gen = torch.Generator().manual_seed(seed * 1000 + width)
    values = torch.randint(0, 4, (9, width), generator=gen).float()  # ties in every row
    values[0] = float("-inf")
    values[1, (seed * 613) % width] = float("nan")
    values[2, width - 1] = float("nan")  # the NaN past the vector loop, or the only one
    values[3, : seed + 1] = float("inf")
    values[4] = torch.randn(width, generator=gen)
    values[5] = 0.0
    values[5, width // 2] = -0.0
    values[6, -1] = 7.0  # the largest value last
    values[7, 0] = 7.0  # and first
    assert torch.equal(_native(values), torch.argmax(values, dim=-1))


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_split_over_threads_give_the_same_indices(threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    values = torch.randn(64, 49152, generator=torch.Generator().manual_seed(5))
    values[17, 40000] = 100.0
    expected = torch.argmax(values, dim=-1)
    assert torch.equal(_native(values), expected) and int(expected[17]) == 40000


def test_the_sampler_takes_the_native_call_where_it_can(monkeypatch):
    calls = []
    real = cpu_argmax.row_argmax
    monkeypatch.setattr(cpu_argmax, "row_argmax", lambda v: calls.append(v.shape) or real(v))
    logits = torch.randn(4, 300)
    assert torch.equal(exponential_race.row_argmax(logits), torch.argmax(logits, dim=-1))
    assert calls == [(4, 300)]
    strided = logits[:, ::2]  # not contiguous: torch's path, the same answer
    assert torch.equal(exponential_race.row_argmax(strided), torch.argmax(strided, dim=-1))
    assert calls == [(4, 300)]
    assert exponential_race.row_argmax(torch.empty(0, 5)).shape == (0,)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_rows_of_other_dtypes_take_torchs_path_with_its_answer(dtype):
    """The native call reads float32 only: bf16 logits (a bf16 model's) or float64 rows go
    to torch and get torch's indices, not a float32 reading of their bytes."""
    values = torch.randn(4, 300, generator=torch.Generator().manual_seed(3)).to(dtype)
    values[2, 250] = 50.0
    assert not cpu_argmax.takes(values)
    got = exponential_race.row_argmax(values)
    assert torch.equal(got, torch.argmax(values, dim=-1)) and int(got[2]) == 250


def test_an_empty_row_is_refused():
    with pytest.raises(ValueError, match="1 or more"):
        cpu_argmax.row_argmax(torch.empty(3, 0))
