"""engine.execution.exponential_race.row_argmax is torch.argmax(dim=-1), index for index: the
first of ties, a NaN as the largest, rows of -inf, strided views."""

from __future__ import annotations

import pytest
import torch

from engine.execution.exponential_race import row_argmax


@pytest.mark.parametrize("seed", range(12))
def test_row_argmax_is_torch_argmax(seed):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 4, (17, 3001), generator=gen).float()  # ties in every row
    values[seed, (seed * 613) % 3001] = float("nan")
    values[(seed + 1) % 17] = float("-inf")
    values[(seed + 2) % 17, : seed + 1] = float("inf")
    for view in (values, values[:, ::3], values[::2].t().contiguous().t()):
        assert torch.equal(row_argmax(view), torch.argmax(view, dim=-1))
