"""`batchpilot trace`'s options where the main tests (test_trace_cli.py) do not look: a
summary's window, `slow --by` and its default limit, `steps --batch` over a window, the exit
status without a subcommand, and `--token-env`. Over the same simulated trace (9 requests,
190 steps 10 ms apart)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fixtures.http_stub import QuietHandler, reply, served
from fixtures.trace_data import fill_trace

from tests.control.trace.test_trace_cli import cli, query


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("trace-edges") / "trace.duckdb")
    fill_trace(path).stop()
    return path


def test_a_summary_covers_only_its_window(db, capsys):
    [(lo, total)] = query(db, "SELECT min(start_time), count(*) FROM steps")
    code, out, err = cli(capsys, "--db", db, "summary", "--since", str(lo), "--until",
                         str(lo + 0.5), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["since"], data["until"]) == (lo, lo + 0.5)
    assert 0 < data["steps"]["steps"] < total  # half a second of a two-second trace
    assert data["steps"]["last"] <= lo + 0.5 + 0.011  # a step's end, 10 ms after its start


def test_slow_by_ttft_ranks_by_time_to_first_token(db, capsys):
    code, out, err = cli(capsys, "--db", db, "slow", "--by", "ttft_s", "--limit", "3",
                         "--json")
    assert code == 0, err
    by_ttft = [r for (r,) in query(db, "SELECT request_id FROM requests WHERE ttft_s IS NOT"
                                   " NULL ORDER BY ttft_s DESC LIMIT 3")]
    by_e2e = [r for (r,) in query(db, "SELECT request_id FROM requests ORDER BY e2e_s DESC"
                                  " LIMIT 3")]
    assert by_ttft != by_e2e  # the trace tells the two orders apart
    assert [row["request_id"] for row in json.loads(out)] == by_ttft


def test_slow_lists_up_to_ten_requests_by_default(db, capsys):
    [(n,)] = query(db, "SELECT count(*) FROM requests")
    assert 5 < n <= 10
    code, out, err = cli(capsys, "--db", db, "slow", "--json")
    assert code == 0, err
    assert len(json.loads(out)) == n


def test_steps_in_a_window_with_batch_list_the_requests_that_ran(db, capsys):
    [(lo,)] = query(db, "SELECT min(start_time) FROM steps")
    argv = ["--db", db, "steps", "--since", str(lo), "--until", str(lo + 0.035)]
    code, plain, _ = cli(capsys, *argv)
    assert code == 0 and "decode  r" not in plain and "prefill  r" not in plain
    code, batched, err = cli(capsys, *argv, "--batch")
    assert code == 0, err
    assert "prefill  r" in batched or "decode  r" in batched


def test_trace_without_a_subcommand_prints_help_and_exits_2(capsys):
    code, out, err = cli(capsys)
    assert code == 2 and not out
    assert "SUBCOMMAND" in err and "summary" in err


# ---- --token-env: the read token from another variable ---------------------------------
TOKEN = "read-secret-2"


class _NeedsToken(QuietHandler):
    """/v1/trace/summary answers {} with the bearer TOKEN, 401 without it."""

    def do_GET(self):  # noqa: N802  (http.server's name)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            reply(self, 401, {"error": {"message": "a read token is required"}})
        else:
            reply(self, 200, {"since": None})


@pytest.fixture
def needs_token(monkeypatch) -> Iterator[str]:
    monkeypatch.delenv("BATCHPILOT_TOKEN", raising=False)
    with served(_NeedsToken) as url:
        yield url


def test_token_env_names_the_variable_holding_the_read_token(needs_token, capsys,
                                                             monkeypatch):
    monkeypatch.setenv("OPS_READ_TOKEN", TOKEN)
    code, out, err = cli(capsys, "--url", needs_token, "--token-env", "OPS_READ_TOKEN",
                         "summary", "--json")
    assert code == 0 and json.loads(out) == {"since": None}, err
    code, _, err = cli(capsys, "--url", needs_token, "summary")  # $BATCHPILOT_TOKEN: unset
    assert code == 1 and "answered 401" in err
