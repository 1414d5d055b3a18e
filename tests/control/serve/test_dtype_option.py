"""`batchpilot serve --dtype`: a bad value fails before anything loads; a good one reaches
load_model, and the engine parts say which dtype the weights run in (for the ready line)."""

from __future__ import annotations

import pytest

import engine.models
from control.cli.main import main
from control.serve.bootstrap import build_parts
from control.serve.settings import ServeSettings


def test_a_bad_dtype_is_refused_before_anything_loads(capsys):
    assert main(["serve", "--dtype", "fp16", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "dtype='fp16' must be one of auto, float32, bfloat16" in err


def test_settings_validate_the_dtype():
    assert ServeSettings(dtype="bf16").validate().dtype == "bf16"
    with pytest.raises(ValueError, match="dtype='int4' must be one of"):
        ServeSettings(dtype="int4").validate()


def test_serve_help_lists_dtype(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--dtype" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_the_dtype_reaches_load_model_and_the_parts(dtype, monkeypatch, tiny_loaded,
                                                   one_torch_thread):
    asked = []

    def fake_load(model, dtype, device):
        asked.append((model, dtype, device))
        return tiny_loaded

    monkeypatch.setattr(engine.models, "load_model", fake_load)
    settings = ServeSettings(model="tiny", device="cpu", dtype=dtype,
                             engine_overrides={"max_num_batched_tokens": 256,
                                               "prefill_chunk_size": 64})
    parts = build_parts(settings)
    assert asked == [("tiny", dtype, "cpu")]
    assert parts.weights == "weights: float32 (asked for float32)"  # tiny_loaded's plan
