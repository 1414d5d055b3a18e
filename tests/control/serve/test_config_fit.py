"""Issue #30 item 6: the serving YAML is checked against the config the model runs with.

The tiny model's context is 512 tokens, far under the static default max_model_len
(32768). Before the model loads only what needs no model is checked (preflight); the rest
runs on the fitted config in `build_parts`, the server's start path, and names the fitted
value: a YAML right for the model starts, a wrong one fails the start, and so does a profile
that could never be applied.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from fixtures.serving import SMALL_ENGINE, asgi_client, make_engine, write_yaml

from control.serve.bootstrap import build_parts
from control.serve.engine_loop import AsyncEngine
from control.serve.preflight import preflight
from control.serve.settings import ServeSettings
from engine.config import StaticConfig


def settings_for(model_dir, tmp_path, config: dict) -> ServeSettings:
    path = write_yaml(tmp_path / "serving.yaml", config)
    return ServeSettings(model=str(model_dir), config_path=str(path),
                         engine_overrides=dict(SMALL_ENGINE))


def test_chunked_prefill_off_with_the_models_context_as_budget_starts_and_serves(
        tiny_loaded, tiny_llama_dir, tmp_path):
    context = tiny_loaded.max_model_len
    assert context < StaticConfig().max_model_len  # the default would refuse this budget
    config = {"serving": {"chunked_prefill": False, "max_batched_tokens": context},
              "profiles": {"whole": {"chunked_prefill": False, "max_num_seqs": 2}}}
    preflight(settings_for(tiny_llama_dir, tmp_path, config))  # was refused: 512 < 32768
    engine, _, settings = make_engine(tiny_loaded, config=config, tmp_path=tmp_path)
    assert engine.parts.static.max_model_len == context
    live = engine.live_config
    assert not live.chunked_prefill and live.max_num_batched_tokens == context

    async def scenario():
        async with asgi_client(engine, settings) as client:
            prompt = [10 + i % 400 for i in range(context - 8)]  # runs whole, in one step
            reply = await client.post("/v1/completions", json={
                "model": "tiny", "prompt": prompt, "max_tokens": 4, "ignore_eos": True})
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["prompt_tokens"] == context - 8
            applied = await client.post("/control/profiles/whole", json={})
            assert applied.status_code == 200, applied.text
    asyncio.run(scenario())


def test_a_budget_under_the_fitted_context_fails_the_start_naming_it(
        tiny_loaded, tiny_llama_dir, tmp_path):
    context = tiny_loaded.max_model_len
    config = {"serving": {"chunked_prefill": False, "max_batched_tokens": context - 1}}
    settings = settings_for(tiny_llama_dir, tmp_path, config)
    preflight(settings)  # the context is the model's: known once it is loaded
    message = (f"max_num_batched_tokens={context - 1} must be >= max_model_len ({context},"
               " fitted to the model) when chunked_prefill is off")
    with pytest.raises(ValueError, match=re.escape(message)):
        build_parts(settings, loaded=tiny_loaded)
    # the server's own start: the engine thread fails, and the server exits saying why
    engine = AsyncEngine(lambda: build_parts(settings, loaded=tiny_loaded)).start()
    with pytest.raises(RuntimeError, match=re.escape(message)):
        asyncio.run(engine.wait_loaded())
    assert message in engine.serving_problem()


def test_a_profile_invalid_only_against_the_fitted_config_fails_the_start(
        tiny_loaded, tiny_llama_dir, tmp_path):
    context = tiny_loaded.max_model_len
    config = {"serving": {"max_batched_tokens": 4096, "prefill_chunk_size": 64},
              "profiles": {"long_chunks": {"prefill_chunk_size": 2 * context}}}
    preflight(settings_for(tiny_llama_dir, tmp_path, config))  # 1024 <= 32768: no model yet
    message = (f"profiles.long_chunks: prefill_chunk_size={2 * context} must be in"
               f" 1..max_model_len ({context}, fitted to the model)")
    with pytest.raises(ValueError, match=re.escape(message)):
        build_parts(settings_for(tiny_llama_dir, tmp_path, config), loaded=tiny_loaded)


@pytest.mark.parametrize(("serving", "field"), [
    ({"max_active_sequences": 0}, "max_num_seqs"),
    ({"max_batched_tokens": "many"}, "serving.max_num_batched_tokens"),
    ({"chunked_prefil": False}, "chunked_prefil"),
])
def test_preflight_still_refuses_what_needs_no_model(tiny_llama_dir, tmp_path, serving, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        preflight(settings_for(tiny_llama_dir, tmp_path, {"serving": serving}))


def test_engine_overrides_win_over_the_yaml(tiny_loaded, tmp_path):
    """ServeSettings.engine_overrides are over the YAML's values (as the checklist reads a
    run's config back from its settings): the YAML's values give way to them."""
    path = write_yaml(tmp_path / "serving.yaml",
                      {"serving": {"max_active_sequences": 4, "num_kv_blocks": 128}})
    settings = ServeSettings(model="tiny", config_path=str(path),
                             engine_overrides={"max_num_seqs": 2, "num_kv_blocks": 256})
    parts = build_parts(settings, loaded=tiny_loaded)
    assert parts.static.num_kv_blocks == 256
    assert parts.engine.live_config.max_num_seqs == 2


def test_preflight_refuses_a_trace_file_it_could_not_write(tiny_llama_dir, tmp_path):
    """A --trace-db in a folder that does not exist fails the start before the model is
    loaded, naming the folder (not once the model loaded and the server bound its port)."""
    folder = tmp_path / "gone"
    settings = ServeSettings(model=str(tiny_llama_dir), trace_db=str(folder / "t.duckdb"))
    with pytest.raises(ValueError, match=re.escape(f"directory {str(folder)!r} does not exist")):
        preflight(settings)
