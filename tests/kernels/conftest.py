"""Fixtures of the native kernels' model-level tests: the tiny Llama and Qwen2, and a Llama
of odd sizes, each loaded in float32; and `native_library`, which a test of the C kernels
uses (`needs_native`) so that a library that did not build skips it, or fails it under CI
(tests/fixtures/native_build.py says when)."""

from __future__ import annotations

import pytest
import torch
from fixtures.native_build import require_native
from fixtures.tiny_models import TINY_LLAMA, write_checkpoint

from engine.models import load_model


@pytest.fixture
def native_library():
    """The native library; a test that uses this skips or fails where it is missing."""
    return require_native()


@pytest.fixture(scope="module")
def odd_llama_dir(tmp_path_factory):
    """hidden 63 (3 query heads, 1 KV head) and intermediate 37: an odd number of output
    rows (o_proj, down_proj: the GEMV's single-row tail) and reductions that are not whole
    16-lane vectors."""
    spec = {**TINY_LLAMA, "hidden_size": 63, "intermediate_size": 37,
            "num_attention_heads": 3, "num_key_value_heads": 1}
    arch, seed = spec.pop("arch"), spec.pop("seed")
    return write_checkpoint(tmp_path_factory.mktemp("odd-llama"), arch, seed, **spec)


@pytest.fixture(scope="module", params=["llama", "qwen2", "odd_llama"])
def model(request, tiny_llama_dir, tiny_qwen2_dir, odd_llama_dir):
    path = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir,
            "odd_llama": odd_llama_dir}[request.param]
    return load_model(path, dtype=torch.float32).model
