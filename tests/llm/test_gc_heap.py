"""The heap frozen while the engine runs (engine/gc_heap.py): no collection walks the model's
objects during LLM.generate, which thaws them after, leaves a process's own freeze alone,
and thaws on a failed call too; a served process freezes once it is ready."""

from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace

import pytest

from control.serve import server as serve_module
from engine import LLM, SamplingParams
from engine.gc_heap import freeze_startup_heap, heap_frozen
from engine.llm import PromptRejected
from engine.models import load_model


@pytest.fixture
def thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(load_model(tiny_llama_dir, dtype="float32"), num_kv_blocks=64)


def _counting_steps(llm, monkeypatch) -> list[int]:
    seen: list[int] = []
    step = llm.engine.step

    def counted():
        seen.append(gc.get_freeze_count())
        return step()

    monkeypatch.setattr(llm.engine, "step", counted)
    return seen


def test_generate_runs_on_a_frozen_heap_and_thaws_it_after(llm, monkeypatch, thawed):
    seen = _counting_steps(llm, monkeypatch)
    llm.generate(["a b c", "d e"], SamplingParams(max_tokens=3, temperature=0.0),
                 use_tqdm=False)
    assert seen and min(seen) > 1000  # the model, torch and the rest: frozen each step
    assert gc.get_freeze_count() == 0


def test_a_freeze_of_the_process_own_stays(thawed):
    # frozen objects the run frees leave the permanent generation, so the count can only be
    # compared with 0 (what gc.unfreeze leaves), not with the count before
    gc.freeze()
    assert gc.get_freeze_count() > 0
    with heap_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() > 0  # not thawed: the process's freeze, not the call's


def test_a_failed_generate_thaws_too(llm, thawed):
    small = LLM(llm.loaded, num_kv_blocks=16)  # 256 tokens of KV
    too_big = 300  # past the whole pool, within max_model_len: refused mid-run
    assert too_big < small.engine.static.max_model_len
    with pytest.raises(PromptRejected, match="KV cache holds"):
        small.generate([[5] * too_big], SamplingParams(max_tokens=2), use_tqdm=False)
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("freeze", [True, False])
def test_a_server_freezes_its_heap_once_loaded_unless_embedded(monkeypatch, freeze):
    calls = []
    monkeypatch.setattr(serve_module, "freeze_startup_heap", lambda: calls.append(1))

    async def loaded():
        return None

    server = serve_module.DrainingServer.__new__(serve_module.DrainingServer)
    server.state = SimpleNamespace(engine=SimpleNamespace(wait_loaded=loaded))
    server.announce, server.freeze_heap, server.edge_url = False, freeze, "http://x"
    asyncio.run(server._when_ready())
    assert calls == ([1] if freeze else [])


def test_a_server_collects_start_ups_garbage_before_freezing_the_rest(thawed):
    """Cycles start-up dropped are collected, not frozen for the life of the process (where
    no collection would ever reach them: memory held for nothing)."""
    class Node:
        """A member of a reference cycle."""

    gc.disable()  # no automatic collection: only freeze_startup_heap's own
    try:
        node = Node()
        node.self = node  # a cycle: only the collector frees it
        gone = weakref.ref(node)
        del node
        freeze_startup_heap()
        assert gone() is None
    finally:
        gc.enable()
