"""The KV pool LLM and the server size when num_kv_blocks is not given
(engine/execution/model_runner.py auto_num_kv_blocks): as many blocks as fit the budget (1 GiB
on CPU) in the bytes the cache really takes, K and V, in its own dtype (kv_cache_dtype), not
the weights'."""

from __future__ import annotations

import pytest

from engine.execution.model_runner import CPU_KV_CACHE_BYTES, ModelRunner
from engine.llm import fit_engine_config


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16"])
def test_the_auto_sized_pool_fills_its_budget_in_the_cache_dtype(tiny_loaded, kv_cache_dtype):
    assert tiny_loaded.device.type == "cpu"  # the budget is 1 GiB there (a GPU's: free memory)
    static = fit_engine_config(tiny_loaded, {"kv_cache_dtype": kv_cache_dtype}).static
    few = ModelRunner(tiny_loaded, 4, static.block_size, kv_cache_dtype)
    block_bytes = sum(k.nbytes + v.nbytes for k, v in few.kv_caches) // 4  # allocated
    assert static.num_kv_blocks == CPU_KV_CACHE_BYTES // block_bytes
