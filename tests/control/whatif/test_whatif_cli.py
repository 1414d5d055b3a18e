"""`batchpilot whatif --db FILE`: end to end on a small recorded trace, and every bad
input refused with exit 2 and the control API's wording."""

from __future__ import annotations

import json
import re

import pytest
from whatif_sim_trace import START, record

from control.cli.http_json import HTTPFailure
from control.cli.main import main
from control.whatif import cli as whatif_cli
from control.whatif.cli import proposals
from engine.config import LiveConfig


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("whatif") / "trace.duckdb")
    record(path, LiveConfig(max_num_seqs=8, max_num_batched_tokens=256,
                            prefill_chunk_size=128), n=80, cancel_every=9)
    return path


def test_a_set_prints_the_table_side_by_side(db, capsys):
    assert main(["whatif", "--db", db, "--set", "max_num_seqs=2", "--slo-ttft", "0.1"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert header.split() == ["metric", "recorded", "predicted", "proposed",
                              "predicted/recorded", "proposed/predicted"]
    # the diff is against the window's config (a live change since does not show in it),
    # and the window reads in local clock times, as the trace commands print them
    assert "proposed: max_num_seqs 8 -> 2 (against the window's config, version 1)" in out
    window = out.splitlines()[0]
    assert re.fullmatch(r"what-if over \d+ requests, \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}"
                        r" \.\. \d\d:\d\d:\d\d\.\d{3} \([\d.]+ s\), run \S+", window), window
    assert "goodput_rps" in out and "\nlane interactive" in out and "\ntenant rag" in out
    assert "note: no serving YAML" in out  # the defaults it assumed are said


def test_compare_gives_json_and_a_plot(db, tmp_path, capsys):
    png = tmp_path / "whatif.png"
    code = main(["whatif", "--db", db, "--since", str(START), "--json", "--plot", str(png),
                 "--compare", "narrow:max_num_seqs=2,max_num_batched_tokens=64",
                 "--compare", "chunk32:prefill_chunk_size=32"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["columns"] == ["recorded", "predicted", "narrow", "chunk32"]
    assert result["configs"]["narrow"]["diff"] == {"max_num_batched_tokens": [256, 64],
                                                   "max_num_seqs": [8, 2]}
    ttft = next(r for r in result["rows"] if r["metric"] == "ttft_p99_s")
    assert ttft["ratios"]["narrow"] > 1.0  # fewer seqs and tokens per step: slower start
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "max_num_seqs=0"], "max_num_seqs=0 must be in 1..8192"),
    (["--set", "no_such_knob=3"], "no_such_knob"),
    (["--set", "block_size=32"], "static setting"),
    (["--set", "max_num_seqs"], "is not KEY=VALUE"),
    (["--compare", "nocolon"], "is not NAME:KEY=VALUE"),
    (["--set", "max_num_seqs=4", "--since", "2100-01-01T00:00:00"], "no request arrived"),
    (["--set", "max_num_seqs=4", "--since", "yesterday-ish"], "is not understood"),
    (["--set", "max_num_seqs=4", "--since", "-1m", "--until", "-2m"],
     "is after until"),
    (["--set", "max_num_seqs=4", "--slo-ttft", "0"], "--slo-ttft=0.0 must be > 0"),
    (["--compare", "a:max_num_seqs=2", "--compare", "a:max_num_seqs=4"], "'a' is named twice"),
    ([], "nothing to predict"),
])
def test_bad_input_is_exit_2_with_what_to_fix(db, capsys, args, needle):
    assert main(["whatif", "--db", db, *args]) == 2
    assert needle in capsys.readouterr().err


def test_a_missing_file_is_exit_2(tmp_path, capsys):
    assert main(["whatif", "--db", str(tmp_path / "none.duckdb"), "--set", "x=1"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_compare_splits_settings_only_at_a_new_key():
    assert proposals(None, ['a:lanes.batch.weight=2,tenant_lanes={"x":"batch"},max_num_seqs=3']
                     ) == {"a": {"lanes": {"batch": {"weight": 2}},
                                 "tenant_lanes": {"x": "batch"}, "max_num_seqs": 3}}


@pytest.mark.parametrize(("status", "code"), [(400, 2), (429, 2), (500, 1), (503, 1),
                                              (None, 1)])
def test_a_servers_refusal_is_exit_2_and_its_failure_exit_1(monkeypatch, capsys, status,
                                                            code):
    """--url: a 4xx is the caller's to fix (2, as a bad flag); a 5xx or no answer is 1."""
    def refuse(*args, **kwargs):
        raise HTTPFailure(status, "no")

    monkeypatch.setattr(whatif_cli, "request_json", refuse)
    assert main(["whatif", "--url", "http://127.0.0.1:9", "--set", "max_num_seqs=4"]) == code
    assert "no" in capsys.readouterr().err


def test_url_sends_the_slo_and_rates_and_leaves_the_defaults_to_the_server(monkeypatch,
                                                                           capsys):
    sent = {}

    def answer(url, path, **kwargs):
        sent.update(kwargs["body"], path=path)
        return {"warnings": []}

    monkeypatch.setattr(whatif_cli, "request_json", answer)
    assert main(["whatif", "--url", "http://127.0.0.1:9", "--set", "max_num_seqs=4",
                 "--slo-ttft", "0.5", "--slo-e2e", "8", "--rate-scale", "2", "--json"]) == 0
    assert sent == {"path": "/v1/whatif", "since": None, "until": None,
                    "compare": {"proposed": {"max_num_seqs": 4}},
                    "slo": {"ttft_s": 0.5, "e2e_s": 8.0}, "rate_scale": 2.0}
