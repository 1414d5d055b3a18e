"""Issue #30 item 6, the reload side: a reloaded serving YAML is checked against the static
config the server runs with (fitted to the model at start), as the start checked it.

The tiny model's context is 512 tokens; the YAML asks for DESIGN.md's 32768, which the
start caps at 512.
"""

from __future__ import annotations

import asyncio

from fixtures.serving import asgi_client, make_engine, write_yaml

from control.admin.config_watch import ConfigWatcher

SERVING = {"max_model_len": 32768, "num_kv_blocks": 256, "max_num_seqs": 4,
           "max_batched_tokens": 256, "prefill_chunk_size": 64}


def test_a_reload_is_checked_against_the_running_fitted_config(tiny_loaded, tmp_path):
    context = tiny_loaded.max_model_len
    engine, _, settings = make_engine(tiny_loaded, config={"serving": SERVING},
                                      tmp_path=tmp_path)
    assert engine.parts.static.max_model_len == context  # capped at the model's

    async def scenario():
        async with asgi_client(engine, settings) as client:
            store = client.app.state.serving.config_store
            watcher = ConfigWatcher(store, settings.config_path)
            # the same file with one live change: its 32768 fits to 512 again, no restart
            write_yaml(tmp_path / "serving.yaml", {"serving": {**SERVING, "max_num_seqs": 3}})
            assert await watcher.reload() == 2, watcher.last_error
            # a profile that could never apply here is refused with the whole reload
            write_yaml(tmp_path / "serving.yaml", {
                "serving": {**SERVING, "max_num_seqs": 2},
                "profiles": {"long_chunks": {"prefill_chunk_size": 2 * context}}})
            assert await watcher.reload() is None
            assert (f"profiles.long_chunks: prefill_chunk_size={2 * context} must be in"
                    f" 1..max_model_len ({context}, fitted to the model)") in watcher.last_error
            assert engine.live_config.max_num_seqs == 3 and store.profiles == {}
            # a max_model_len under the running one is a real change: it needs a restart
            write_yaml(tmp_path / "serving.yaml",
                       {"serving": {**SERVING, "max_model_len": context // 2}})
            assert await watcher.reload() is None
            assert "max_model_len differ" in watcher.last_error
            assert engine.live_config.version == 2
    asyncio.run(scenario())
