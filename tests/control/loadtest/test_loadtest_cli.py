"""`batchpilot loadtest --compare`: the configs it A/Bs must be told apart, and each one
runs on its own prompt texts (a prefix cache must not serve a later config from what an
earlier one computed), without a server: the control API and the runs are stand-ins."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from control.cli.ctl_error import CtlError
from control.loadtest import cli

CHAT = Path(__file__).parents[3] / "playbooks" / "scenarios" / "chat.yaml"


def test_two_configs_under_one_name_are_refused():
    """Their runs would be pooled into one row of the comparison."""
    with pytest.raises(CtlError, match="names must differ"):
        cli.parse_compare(["a:batching=continuous", "a:batching=static"])
    assert [n for n, _ in cli.parse_compare(["a:batching=continuous", "b:batching=static"])
            ] == ["a", "b"]


class _Control:
    def __init__(self, url, token_env):
        self.url, self.calls = url, []

    def call(self, method, path, body=None, **_):
        self.calls.append((method, path))
        return {"data": [{"id": "m"}]} if path == "/v1/models" else {"version": 3}


class _Maker:
    def make(self, num_tokens, seed):
        return f"text {seed}", num_tokens


def test_each_compared_config_runs_on_its_own_prompt_texts(monkeypatch):
    runs: list[tuple[str, dict[int, str]]] = []
    monkeypatch.setattr(cli, "Client", _Control)
    monkeypatch.setattr(cli, "_prompt_maker", lambda name: _Maker())
    monkeypatch.setattr(cli, "_run_one", lambda args, client, planned, prompts, model,
                        scenario, label: runs.append((label, prompts)))
    monkeypatch.setattr(cli, "_report", lambda *a: 0)
    args = Namespace(compare=["a:batching=continuous", "b:batching=static"], rounds=1,
                     scenario=str(CHAT), rate=None, requests=4, url="http://127.0.0.1:1",
                     token_env="NO_SUCH_TOKEN_ENV", tokenizer=None)
    assert cli._main(args) == 0
    (label_a, a), (label_b, b) = runs
    assert label_a.startswith("a ") and label_b.startswith("b ")
    assert a.keys() == b.keys() and len(a) == 4
    assert all(a[i] != b[i] for i in a)


def test_zero_rounds_is_a_usage_error(capsys):
    args = Namespace(compare=["a:batching=continuous", "b:batching=static"], rounds=0,
                     scenario=str(CHAT), rate=None, requests=4, url="http://127.0.0.1:9",
                     token_env="NO_SUCH_TOKEN_ENV", tokenizer=None)
    assert cli.main(args) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err


def test_rounds_of_a_config_pool_their_requests_over_their_summed_time(monkeypatch, capsys):
    """Two 10 s rounds of 4 ok requests each: 8 requests in 20 s, 0.4 requests/s."""
    from control.loadtest.records import PlannedRequest, RequestResult
    from control.loadtest.scenario import load_scenario

    def one_round() -> list[RequestResult]:
        return [RequestResult(PlannedRequest(i, 0.0, 3, 2, "acme", None, True, None), "ok",
                              200, ttft_s=0.1, e2e_s=0.5, chunk_times_s=[0.1, 0.5],
                              prompt_tokens=3, output_tokens=2) for i in range(4)]

    monkeypatch.setattr(cli, "_store", lambda *a: None)
    args = Namespace(json=True, scenario=str(CHAT), url="http://127.0.0.1:1", rounds=2,
                     client_retries=0, rate=None, requests=None, out=None)
    runs = {"current": [(one_round(), 10.0, (0.1, 10.0)), (one_round(), 10.0, (0.1, 10.0))]}
    assert cli._report(args, None, load_scenario(CHAT), [("current", None)], runs) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    assert (summary["requests"], summary["duration_s"]) == (8, 20.0)
    assert summary["request_rps"] == pytest.approx(0.4)
