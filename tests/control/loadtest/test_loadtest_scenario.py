"""Load-test scenarios (control/loadtest/scenario.py) and prompts (prompts.py): the shipped
playbooks load and plan, plans are deterministic per seed, the sampled distributions and
ratios match the configured ones, the trace replays its rows, errors name the field, and
prompts re-encode to the asked token count with a real tokenizer."""

from __future__ import annotations

import statistics
from itertools import pairwise
from pathlib import Path

import pytest
from fixtures.loadtest import small_scenario

from control.loadtest.prompts import PromptMaker, load_tokenizer
from control.loadtest.scenario import (
    load_scenario,
    plan,
    scale_rate,
    with_rate,
)
from engine.sim.workload import load_trace

SCENARIOS = sorted((Path(__file__).parents[3] / "playbooks" / "scenarios").glob("*.yaml"))
N = 5000  # samples for the distribution checks


def _scenario(**overrides):
    return small_scenario(**{"requests": N, "seed": 0, **overrides})


def _gaps(planned):
    times = [r.arrival_s for r in planned]
    return [b - a for a, b in pairwise(times)]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_shipped_scenario_loads_and_plans(path):
    scenario = load_scenario(path)
    planned = plan(scenario)
    assert scenario.description and scenario.slo != type(scenario.slo)()
    assert len(planned) == scenario.requests
    assert [r.index for r in planned] == list(range(len(planned)))
    assert all(b.arrival_s >= a.arrival_s for a, b in pairwise(planned))
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in planned)
    # sized for SmolLM2-135M on a 2-core CPU: short outputs, prompts mostly under ~1000
    assert max(r.output_tokens for r in planned) <= 128
    assert statistics.median(r.prompt_tokens for r in planned) <= 1000
    assert planned[-1].arrival_s <= 180  # seconds of arrivals


def test_shipped_set_is_complete():
    names = {p.stem for p in SCENARIOS}
    assert {"chat", "rag", "summaries", "batch", "mixed", "azure-replay"} <= names


def test_defaults_when_the_file_leaves_keys_out():
    scenario = _scenario(requests=3)
    assert scenario.concurrency == 64  # the runner always gets a cap
    assert {(r.tenant, r.lane, r.stream, r.kind, r.cancel_after_s) for r in plan(scenario)} \
        == {("default", None, True, "chat", None)}


def test_plan_is_deterministic_per_seed():
    kw = {"arrival": {"process": "gamma", "rate": 2.0, "burstiness": 0.5},
          "prompt": {"dist": "lognormal", "mean": 200, "sigma": 1.0},
          "tenants": {"a": 1, "b": 1}, "stream_ratio": 0.5, "requests": 200}
    assert plan(_scenario(**kw)) == plan(_scenario(**kw))
    assert plan(_scenario(**kw)) != plan(_scenario(seed=1, **kw))


def test_with_rate_keeps_every_draw_but_the_arrivals():
    base = _scenario(prompt={"dist": "uniform", "min": 1, "max": 900}, requests=300)
    faster = plan(with_rate(base, 8.0))
    assert [r.prompt_tokens for r in faster] == [r.prompt_tokens for r in plan(base)]
    assert statistics.mean(_gaps(faster)) == pytest.approx(1 / 8.0, rel=0.15)
    assert plan(scale_rate(base, 2.0)) == faster


def test_lognormal_mean_is_the_mean_of_the_tokens():
    planned = plan(_scenario(prompt={"dist": "lognormal", "mean": 300, "sigma": 0.8}))
    assert statistics.mean(r.prompt_tokens for r in planned) == pytest.approx(300, rel=0.05)
    clipped = plan(_scenario(prompt={"dist": "lognormal", "mean": 300, "sigma": 0.8,
                                     "min": 50, "max": 600}))
    lengths = [r.prompt_tokens for r in clipped]
    assert min(lengths) == 50 and max(lengths) == 600  # both bounds reached, none passed


def test_uniform_bounds_and_mean():
    lengths = [r.output_tokens for r in plan(_scenario(output={"dist": "uniform",
                                                              "min": 16, "max": 128}))]
    assert min(lengths) == 16 and max(lengths) == 128
    assert statistics.mean(lengths) == pytest.approx(72, rel=0.03)


def test_gamma_mean_gap_and_burstier_than_poisson():
    def gaps(process, burstiness=1.0):
        arrival = {"process": process, "rate": 4.0}
        if process == "gamma":
            arrival["burstiness"] = burstiness
        return _gaps(plan(_scenario(arrival=arrival)))

    poisson, gamma = gaps("poisson"), gaps("gamma", 0.5)
    assert statistics.mean(poisson) == pytest.approx(0.25, rel=0.05)  # 1 / rate, seconds
    assert statistics.mean(gamma) == pytest.approx(0.25, rel=0.07)
    cv = {name: statistics.stdev(g) / statistics.mean(g)
          for name, g in (("poisson", poisson), ("gamma", gamma))}
    assert cv["poisson"] == pytest.approx(1.0, abs=0.06)
    assert cv["gamma"] == pytest.approx(2**0.5, abs=0.12)  # 1/sqrt(shape)


def test_bursts_send_burst_size_at_once_every_every_s():
    planned = plan(_scenario(arrival={"process": "bursts", "burst_size": 20, "every_s": 10},
                             requests=50))
    assert [r.arrival_s for r in planned] == [10.0 * (i // 20) for i in range(50)]
    assert with_rate(_scenario(arrival={"process": "bursts", "burst_size": 20, "every_s": 10}),
                     4.0).arrival.every_s == pytest.approx(5.0)


def test_duration_s_ends_the_plan():
    planned = plan(_scenario(requests=None, duration_s=100))
    assert planned[-1].arrival_s <= 100
    assert len(planned) == pytest.approx(400, rel=0.15)  # 4 requests/s for 100 s
    assert len(plan(_scenario(requests=50, duration_s=100))) == 50  # whichever ends first
    assert len(plan(_scenario(requests=10_000, duration_s=10))) < 100


def test_trace_replay_uses_the_trace_rows_scaled():
    trace = {"path": "azure_llm_2023_conv.csv", "prompt_scale": 0.1, "output_scale": 0.25,
             "time_scale": 4.0, "limit": 50}
    scenario = _scenario(arrival={"process": "trace"}, prompt={"dist": "trace"},
                         output={"dist": "trace"}, trace=trace, requests=None, duration_s=1e6)
    planned = plan(scenario)
    rows = load_trace(limit=50)  # unscaled
    assert len(planned) == 50  # a replay ends with its rows
    for req, row in zip(planned, rows, strict=True):
        assert req.arrival_s == pytest.approx(row.arrival_s * 4.0)
        assert req.prompt_tokens == max(1, round(row.prompt_tokens * 0.1))
        assert req.output_tokens == max(1, round(row.output_tokens * 0.25))
    slower = plan(scale_rate(scenario, 0.5))
    assert slower[10].arrival_s == pytest.approx(planned[10].arrival_s * 2)
    # --rate on a replay: the trace's shape, its mean rate the one asked (it once refused)
    at_two = plan(with_rate(scenario, 2.0))
    span = at_two[-1].arrival_s - at_two[0].arrival_s
    assert (len(at_two) - 1) / span == pytest.approx(2.0)
    factor = at_two[10].arrival_s / planned[10].arrival_s
    assert all(a.arrival_s == pytest.approx(p.arrival_s * factor)
               for a, p in zip(at_two, planned, strict=True))
    assert [a.prompt_tokens for a in at_two] == [p.prompt_tokens for p in planned]
    one = _scenario(arrival={"process": "trace"}, prompt={"dist": "trace"},
                    output={"dist": "trace"}, trace={**trace, "limit": 1}, requests=None,
                    duration_s=1e6)
    with pytest.raises(ValueError, match="all arrive at once"):
        with_rate(one, 2.0)


def test_ratios_of_stream_cancel_rag_tenants_lanes():
    planned = plan(_scenario(
        stream_ratio=0.8, tenants={"acme": 3, "globex": 1},
        lanes={"interactive": 4, "batch": 1, "auto": 1},
        cancel={"ratio": 0.05, "after_s": {"dist": "uniform", "min": 0.5, "max": 3}},
        rag={"ratio": 0.2, "context": {"dist": "uniform", "min": 1500, "max": 3000},
             "lane": "long_context"}))

    def share(pred):
        return sum(map(pred, planned)) / len(planned)

    assert share(lambda r: r.stream) == pytest.approx(0.8, abs=0.02)
    assert share(lambda r: r.tenant == "acme") == pytest.approx(0.75, abs=0.02)
    assert share(lambda r: r.cancel_after_s is not None) == pytest.approx(0.05, abs=0.01)
    assert all(0.5 <= r.cancel_after_s <= 3 for r in planned if r.cancel_after_s is not None)
    rag = [r for r in planned if r.kind == "rag"]
    assert len(rag) / len(planned) == pytest.approx(0.2, abs=0.02)
    assert all(r.lane == "long_context" and 1600 <= r.prompt_tokens <= 3100 for r in rag)
    chat = [r for r in planned if r.kind == "chat"]
    assert all(r.prompt_tokens == 100 for r in chat)  # context + question only for rag
    lanes = [r.lane for r in chat]
    assert lanes.count("interactive") / len(chat) == pytest.approx(4 / 6, abs=0.02)
    assert lanes.count(None) / len(chat) == pytest.approx(1 / 6, abs=0.02)  # auto: no lane
    assert all(r.ignore_eos for r in planned)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"rates": 1}, r"unknown key\(s\) \['rates'\] in 'scenario'; allowed: \[.*'requests'"),
    ({"arrival": {"process": "poisson", "rate": 1, "shape": 2}},
     r"unknown key\(s\) \['shape'\] in 'arrival'; allowed: \['process', 'rate'\]"),
    ({"prompt": {"dist": "uniform", "min": 1, "max": 9, "mean": 3}},
     r"unknown key\(s\) \['mean'\] in 'prompt'; allowed: \['dist', 'max', 'min'\]"),
    ({"prompt": {"dist": "normal", "mean": 3}},
     r"prompt.dist='normal' must be one of \['fixed', 'lognormal', 'trace', 'uniform'\]"),
    ({"cancel": {"ratio": 0.1, "after_s": {"dist": "trace"}}},
     r"cancel.after_s.dist='trace' must be one of \['fixed', 'lognormal', 'uniform'\]"),
    ({"arrival": {"process": "poisson", "rate": -2}}, r"arrival.rate=-2 must be > 0"),
    ({"arrival": {"process": "flood"}}, r"arrival.process='flood' must be one of"),
    ({"requests": None}, r"missing 'requests' .* or 'duration_s'"),
    ({"requests": 0}, r"requests=0 must be > 0"),
    ({"stream_ratio": 1.5}, r"stream_ratio=1.5 must be <= 1"),
    ({"output": {"dist": "uniform", "min": 10, "max": 5}}, r"output.min=10 must be <="),
    ({"prompt": {"dist": "trace"}}, r"prompt.dist='trace' needs a 'trace:' block"),
    ({"trace": {"path": "missing.csv"}}, r"trace.path='missing.csv': no such file"),
    ({"slo": {"ttft": 1}}, r"unknown key\(s\) \['ttft'\] in 'slo'"),
    ({"prompt": {"dist": "uniform", "min": 1, "max": 9, "maxx": 3}},
     r"unknown key\(s\) \['maxx'\] in 'prompt' \(did you mean max\?\)"),
    ({"tenants": {"a": -1}}, r"tenants.a=-1 must be >= 0"),
    ({"concurrency": "lots"}, r"concurrency='lots' must be an integer"),
    ({"arrival": None}, r"missing 'arrival'"),
])
def test_errors_name_the_field_and_what_is_allowed(overrides, message):
    with pytest.raises(ValueError, match=r"^test.yaml: " + message):
        _scenario(**overrides)


def test_load_scenario_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_scenario(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_scenario(bad)
    with pytest.raises(ValueError, match="rate=0 must be a number > 0"):
        with_rate(_scenario(), 0)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def test_prompts_reencode_to_the_asked_length(tiny_tokenizer):
    maker = PromptMaker(tiny_tokenizer)
    for n in (1, 7, 64, 500):
        for seed in range(5):
            text, got = maker.make(n, seed)
            assert got == n == len(tiny_tokenizer.encode(text, add_special_tokens=False))
    assert maker.make(64, 3) == maker.make(64, 3)
    assert maker.make(64, 3)[0] != maker.make(64, 4)[0]
    assert maker.make(0, 1) == ("", 0)


def test_prompts_wrap_around_a_short_corpus(tiny_tokenizer):
    maker = PromptMaker(tiny_tokenizer, corpus="The quick brown fox jumps over the lazy dog. ")
    text, got = maker.make(200, seed=1)  # far longer than the corpus's tokens
    assert len(maker.ids) < 50 and abs(got - 200) <= 3
    assert got == len(tiny_tokenizer.encode(text, add_special_tokens=False))


def test_load_tokenizer_reads_a_checkpoint_dir(tiny_llama_dir, tiny_tokenizer):
    tokenizer = load_tokenizer(tiny_llama_dir)
    text = "The scheduler picks the running decodes first."
    assert tokenizer.encode(text) == tiny_tokenizer.encode(text)


def test_each_run_of_a_comparison_gets_its_own_texts_of_the_same_lengths(tiny_tokenizer):
    from control.loadtest.cli import run_prompts

    maker = PromptMaker(tiny_tokenizer)
    planned = plan(load_scenario(SCENARIOS[0].with_name("chat.yaml")))[:6]
    a = run_prompts(maker, planned, "1:continuous:0")
    b = run_prompts(maker, planned, "1:static:0")
    assert a == run_prompts(maker, planned, "1:continuous:0")  # reproducible
    for p in planned:  # no shared text: a prefix cache cannot carry one run into the next
        assert a[p.index] != b[p.index]
        assert maker.count(a[p.index]) == maker.count(b[p.index]) == p.prompt_tokens


@pytest.mark.parametrize(("overrides", "message"), [
    ({"cancel": {"ratio": 0.1, "after": 1}}, r"unknown key\(s\) \['after'\] in 'cancel'"),
    ({"rag": {"ratio": 0.1, "lanes": "x"}}, r"unknown key\(s\) \['lanes'\] in 'rag'"),
    ({"trace": {"path": "t.csv", "scale": 2}}, r"unknown key\(s\) \['scale'\] in 'trace'"),
], ids=["cancel", "rag", "trace"])
def test_an_unknown_key_in_any_block_is_refused(overrides, message):
    with pytest.raises(ValueError, match=r"^test.yaml: " + message):
        _scenario(**overrides)
