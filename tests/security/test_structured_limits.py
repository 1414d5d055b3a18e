"""Issue #29: one request's structured output must not stall the server for everyone.

A schema past `max_schema_bytes` is refused before any compile; a compile past
`grammar_compile_timeout_s` is a 400 while it runs on, off the tokenizer thread, so plain
and small-schema requests keep flowing; with all `max_grammar_compiles` slots taken a new
schema gets a 429 at once. The runaway schemas are real: a few `pattern`s with nested
repeats, `(a{1,100}b){1,300}`, which xgrammar 0.2.9 expands into large automata. Measured on
the 2-core dev VM, tiny model's 512-token vocabulary: 4 such properties (281 bytes) compile
in 2.6 s idle, 7.8 s under load 4.7; 1 property in 0.2-0.6 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import string
import threading
import time

import pytest
from fixtures.serving import asgi_client, make_engine

from control.api.limits import RequestLimits
from engine.structured.compile_slots import CompilesBusy, CompileSlots

POOL = string.ascii_letters + string.digits  # each runaway gets characters of its own
SMALL = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                "maximum": 9}},
         "required": ["n"], "additionalProperties": False}
TIMEOUT_S = 0.25  # innocent small schemas compile in ~1 ms; a runaway in seconds


def runaway_schema(first: int, properties: int = 4) -> dict:
    """A schema that compiles for seconds (see the module): characters POOL[first:] on, so
    no two runaways share a cached rule or a compile."""
    props = {f"p{i}": {"type": "string", "pattern": f"({POOL[first + 2 * i]}{{1,100}}"
                                                    f"{POOL[first + 2 * i + 1]}){{1,300}}"}
             for i in range(properties)}
    return {"type": "object", "properties": props, "required": list(props)}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


@pytest.fixture(scope="module")
def engine(tiny_loaded, one_torch_thread):
    engine, _spy, settings = make_engine(tiny_loaded)
    yield engine, settings
    engine.stop()


@contextlib.asynccontextmanager
async def served(engine, **limits):
    """A client of an app over the module's engine with these limits; on exit, waits for
    the app's abandoned compiles to end (at most 120 s), so no later test shares its cores
    with one."""
    engine, settings = engine
    settings = settings.replace(limits=RequestLimits(**limits))
    async with asgi_client(engine, settings, stop=False) as client:
        try:
            yield client, client.app.state.serving
        finally:
            slots = client.app.state.serving.grammar_compiles
            deadline = time.monotonic() + 120
            while slots.running and time.monotonic() < deadline:
                await asyncio.sleep(0.1)


async def complete(client, **fields):
    body = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 4, **fields}
    started = time.monotonic()
    reply = await client.post("/v1/completions", json=body)
    return reply, time.monotonic() - started


async def compiling(slots, count: int = 1, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while slots.running < count:
        assert time.monotonic() < deadline, "the compile never started"
        await asyncio.sleep(0.005)


def test_a_schema_past_max_schema_bytes_is_refused_before_compiling(engine):
    async def scenario() -> None:
        big = {"enum": [f"välue-{i:02d}" for i in range(34)]}  # ä: 2 bytes, 1 character
        size = len(json.dumps(big, separators=(",", ":"), ensure_ascii=False).encode())
        assert size > 400 >= len(json.dumps(big, separators=(",", ":"), ensure_ascii=False))
        async with served(engine, max_schema_bytes=400) as (client, state):
            for fields, param in (({"response_format": schema_format(big)}, "response_format"),
                                  ({"guided_json": big}, "guided_json"),
                                  ({"guided_json": json.dumps(big)}, "guided_json")):
                reply, _ = await complete(client, **fields)
                assert reply.status_code == 400, reply.text
                error = reply.json()["error"]
                assert error["param"] == param
                assert error["message"].startswith(f"{param}: the schema is {size} bytes")
                assert "(limit max_schema_bytes=400)" in error["message"]
            assert state.grammar_compiles.counts.started == 0  # refused before any compile
            # guided_json as text: its spacing does not count, the compact JSON does
            small = {"enum": [f"v{i}" for i in range(30)]}
            spaced = json.dumps(small, indent=8)
            assert len(spaced) > 400 >= len(json.dumps(small, separators=(",", ":")))
            reply, _ = await complete(client, guided_json=spaced)
            assert reply.status_code == 200, reply.text

    asyncio.run(scenario())


def test_a_pattern_repeating_past_the_bound_is_refused_before_compiling(engine):
    # {"pattern": "a{30000}"}: 40 bytes that held a core and a compile slot ~50 s
    long_repeat = {"type": "string", "pattern": "a{30000}"}
    keyed = {"type": "object", "patternProperties": {"^k{1,5000}$": {"type": "integer"}}}

    async def scenario() -> None:
        async with served(engine) as (client, state):
            for schema, shown in ((long_repeat, "30000"), (keyed, "5000")):
                reply, _ = await complete(client, guided_json=schema)
                assert reply.status_code == 400, reply.text
                error = reply.json()["error"]
                assert error["param"] == "guided_json" and f"{shown} times" in error["message"]
            deep = ('{"type": "array", "items": ' * 1500 + '{"type": "string"}'  # past json's
                    + "}" * 1500)  # recursion limit (the client's too: sent as text)
            reply = await client.post("/v1/completions", headers={
                "Content-Type": "application/json"}, content='{"model": "tiny", "prompt":'
                ' "hi", "max_tokens": 4, "guided_json": ' + deep + "}")
            assert reply.status_code == 400, reply.text
            assert state.grammar_compiles.counts.started == 0
            ordinary = {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}
            reply, _ = await complete(client, guided_json=ordinary,
                                      response_format=None, max_tokens=2)
            assert reply.status_code == 200, reply.text

    asyncio.run(scenario())


def test_a_runaway_compile_times_out_and_stalls_no_one(engine, caplog):
    async def scenario() -> None:
        caplog.set_level(logging.WARNING, logger="batchpilot.http")
        async with served(engine, grammar_compile_timeout_s=TIMEOUT_S) as (client, state):
            slots = state.grammar_compiles
            runaway = asyncio.create_task(complete(
                client, response_format=schema_format(runaway_schema(0))))
            await compiling(slots)
            # while it compiles: a plain completion and a small schema are served at once
            plain, plain_s = await complete(client)
            small, small_s = await complete(client, guided_json=SMALL, max_tokens=16)
            reply, runaway_s = await runaway
            assert slots.running == 1, "the runaway ended too soon to prove anything"
            assert plain.status_code == 200 and plain_s < 2.0, (plain.text, plain_s)
            assert small.status_code == 200 and small_s < 2.0, (small.text, small_s)
            assert json.loads(small.json()["choices"][0]["text"])["n"] in range(10)
            assert reply.status_code == 400, reply.text
            assert TIMEOUT_S <= runaway_s < TIMEOUT_S + 2.0
            error = reply.json()["error"]
            assert error["param"] == "response_format"
            assert error["message"].startswith(
                f"response_format: the schema did not compile within {TIMEOUT_S:g} s"
                " (limit grammar_compile_timeout_s)")
            # an operator sees it: a warning naming the field, and a counter in /metrics
            warnings = [m for m in map(logging.LogRecord.getMessage, caplog.records)
                        if "did not compile" in m]
            assert len(warnings) == 1 and warnings[0].startswith("response_format:")
            metrics = (await client.get("/metrics")).text
            assert ('batchpilot_grammar_compiles_total{model="tiny",outcome="timed_out"} 1.0'
                    in metrics)
            assert 'batchpilot_grammar_compiles_running{model="tiny"} 1.0' in metrics

    asyncio.run(scenario())


def test_busy_compile_slots_answer_429_and_one_schema_takes_one_slot(engine):
    async def scenario() -> None:
        async with served(engine, grammar_compile_timeout_s=TIMEOUT_S,
                          max_grammar_compiles=1) as (client, state):
            slots = state.grammar_compiles
            slow = json.dumps(runaway_schema(8))
            first, _ = await complete(client, guided_json=slow)
            assert first.status_code == 400 and "did not compile" in first.text
            # the same schema again joins the compile still running: no second slot taken
            again, _ = await complete(client, guided_json=slow)
            assert again.status_code == 400 and "did not compile" in again.text
            busy, busy_s = await complete(client, guided_json=SMALL)
            plain, _ = await complete(client)
            assert slots.running == 1, "the runaway ended too soon to prove anything"
            assert busy.status_code == 429, busy.text
            assert busy_s < 1.0  # refused at once, not queued behind the runaway
            assert busy.headers["Retry-After"] == "1"
            error = busy.json()["error"]
            assert error["param"] == "guided_json" and error["code"] == "grammar_compiler_busy"
            assert "the grammar compiler is busy" in error["message"]
            assert "(limit max_grammar_compiles=1)" in error["message"]
            assert plain.status_code == 200, plain.text
            counts = slots.counts
            assert (counts.started, counts.joined, counts.refused_busy, counts.timed_out,
                    counts.abandoned) == (1, 1, 1, 2, 1)

    asyncio.run(scenario())


def test_grammar_cache_compiles_beside_a_runaway(tiny_loaded):
    """GrammarCache's compiles are not serialized: a small schema compiles in
    milliseconds while a runaway schema compiles on the same cache."""
    from engine.structured.grammar import cache_for
    from engine.structured.spec import StructuredOutput

    tokenizer = tiny_loaded.tokenizer
    cache = cache_for(tokenizer, 512, tokenizer.eos_token_id)
    cache.compile(StructuredOutput.json_object())  # the compiler built (~0.1 s, once)
    slow = threading.Thread(target=cache.compile, daemon=True,
                            args=(StructuredOutput.json_schema(runaway_schema(16)),))
    slow.start()
    time.sleep(0.05)  # the runaway is inside xgrammar
    started = time.monotonic()
    compiled = cache.compile(StructuredOutput.json_schema(SMALL))
    elapsed = time.monotonic() - started
    assert elapsed < 1.0 and compiled.grammar is not None, f"waited {elapsed:.1f} s"
    assert slow.is_alive(), "the runaway ended too soon to prove anything"
    slow.join(120)


def test_compile_slots_bound_join_and_free():
    """Deterministic, no xgrammar: a slot is a running compile, not a waiting caller."""
    slots = CompileSlots(2)
    release = threading.Event()
    a = slots.submit("a", lambda: release.wait(10) and "A")
    assert slots.submit("a", lambda: "never run") is a  # joined, not started again
    b = slots.submit("b", lambda: release.wait(10) and "B")
    with pytest.raises(CompilesBusy):
        slots.submit("c", lambda: "C")
    assert not a.cancel()  # a caller cannot cancel a compile others may have joined
    slots.abandon(a)
    slots.abandon(a)  # two callers gave up on one compile: two timeouts, one abandoned
    assert (slots.running, slots.counts.abandoned_running) == (2, 1)
    release.set()
    assert (a.result(10), b.result(10)) == ("A", "B")
    assert slots.running == 0 and slots.counts.abandoned_running == 0
    failed = slots.submit("c", lambda: 1 / 0)  # a free slot again; errors reach the caller
    with pytest.raises(ZeroDivisionError):
        failed.result(10)
    counts = slots.counts
    assert (counts.started, counts.joined, counts.refused_busy, counts.timed_out,
            counts.abandoned) == (3, 1, 1, 2, 1)


def test_compile_slots_refuse_a_capacity_below_one():
    """No slot at all would answer 429 to every schema: refused when built, not served."""
    for capacity in (0, -1):
        with pytest.raises(ValueError, match="must be >= 1"):
            CompileSlots(capacity)
    assert CompileSlots(1).capacity == 1


def test_grammar_token_ids_stay_inside_the_logits(tiny_loaded):
    """No id a grammar allows reaches past the logits it masks: the grammar is compiled for
    the logits' width (ids past it dropped), a stop id past it is refused, and a grammar of
    another width is refused at the first sample. (The last held before issue #29.)"""
    import torch

    from engine.request import Request, SamplingParams
    from engine.structured.constrain import constrain_logits
    from engine.structured.grammar import GrammarCache, cache_for
    from engine.structured.spec import StructuredOutput

    tokenizer = tiny_loaded.tokenizer  # 512 ids; the eos id is inside
    with pytest.raises(ValueError, match=r"EOS ids \[600\] are outside its 500 logits"):
        GrammarCache(tokenizer, 500, (600,))  # xgrammar would drop it: JSON without an end
    spec = StructuredOutput.json_object()
    narrow = cache_for(tokenizer, 500, tokenizer.eos_token_id).bind(spec)
    assert narrow.compiled.grammar.tokenizer_info.vocab_size == 500
    assert narrow.compiled.token_filter.shape == (16,)  # ceil(500 / 32) words
    # its row of a bitmask (xgrammar refuses any other width) allows no id past 499, nor
    # writes into the next row: ids 500..511 of the last word stay clear
    import xgrammar as xgr

    bitmask = torch.zeros((3, 16), dtype=torch.int32)
    matcher = xgr.GrammarMatcher(narrow.compiled.grammar)
    matcher.fill_next_token_bitmask(bitmask, 1)
    allowed = [t for t in range(3 * 512) if bitmask.view(-1)[t // 32] >> (t % 32) & 1]
    assert allowed and min(allowed) >= 512 and max(allowed) < 512 + 500
    with pytest.raises(RuntimeError, match="bitmask's shape is not valid"):
        matcher.fill_next_token_bitmask(torch.zeros((1, 17), dtype=torch.int32), 0)
    # a grammar of another width than the logits fails the request, never indexes past them
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=4, structured_output=narrow), 0.0)
    logits = torch.zeros((1, 480))
    with pytest.raises(ValueError, match="compiled for 500 tokens, the model's logits have 480"):
        constrain_logits(logits, [req])
