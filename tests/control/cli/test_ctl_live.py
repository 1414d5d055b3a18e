"""`batchpilot ctl` against the real server (uvicorn in a thread over the tiny model):
the commands steer it, its refusals and its tokens reach the user as the CLI's exit codes."""

from __future__ import annotations

import json
import re

import pytest


@pytest.fixture(scope="module")
def live(tiny_loaded, tmp_path_factory):
    """A real server (uvicorn in a thread) with one profile; no tokens: loopback, open."""
    from fixtures.serving import LiveServer, make_engine

    config = {"profiles": {"degrade": {"max_active_sequences": 2}}}
    engine, _, settings = make_engine(tiny_loaded, config=config,
                                      tmp_path=tmp_path_factory.mktemp("ctl"))
    with LiveServer(engine, settings.replace(watch_config=False)) as url:
        yield url


def test_ctl_steers_the_real_server(live, ctl, monkeypatch):
    monkeypatch.setenv("BATCHPILOT_URL", live)
    code, out, _ = ctl("get")
    assert code == 0 and out.startswith("version 1   admission open\n")
    before = json.loads(ctl("get", "--json")[1])["config"]["max_num_seqs"]
    code, out, err = ctl("set", "max_num_seqs=3", "--reason", "test")
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"max_num_seqs: {before} -> 3", "applied: now version 2 (was 1)"]
    assert re.search(r"^  max_num_seqs\s+3$", ctl("get")[1], re.M)
    history = ctl("history")[1].splitlines()
    assert history[-1].split()[0] == "2" and "test" in history[-1]
    assert f"max_num_seqs {before}->3" in history[-1]

    code, out, _ = ctl("set", "max_active_sequences=5", "--dry-run")
    assert code == 0 and out.splitlines() == [
        "max_num_seqs: 3 -> 5", "dry run: nothing was applied (still version 2)"]
    code, out, _ = ctl("set", "lanes.bulk.weight=0.5", "lanes.bulk.batching=static",
                       "tenant_lanes.acme=bulk")
    assert code == 0 and "applied: now version 3 (was 2)" in out
    assert re.search(r"^bulk\s+0\.5\s+-\s+-\s+fcfs\s+false\s+-\s+false\s+false\s+static"
                     r"\s+none\s+0\s+0$", ctl("lanes")[1], re.M)
    code, out, _ = ctl("set", "lanes.bulk=null", "tenant_lanes.acme=null",
                       "--move", "bulk=batch")
    assert code == 0 and "lanes.bulk: {" in out and "tenant_lanes.acme: bulk -> null" in out
    assert "bulk" not in ctl("lanes")[1]

    code, out, _ = ctl("profile", "degrade", "--reason", "overload")
    assert code == 0 and out.splitlines() == ["max_num_seqs: 3 -> 2", "applied: now version 5"]
    code, out, _ = ctl("rollback", "2", "--reason", "undo")
    assert code == 0 and out.splitlines() == ["max_num_seqs: 2 -> 3", "applied: now version 6"]
    rows = [line.split() for line in ctl("history")[1].splitlines()[1:]]
    assert [(r[0], r[4]) for r in rows[-2:]] == [("5", "profile:degrade"), ("6", "rollback:2")]
    code, out, _ = ctl("rollback", "previous", "--reason", "undo the undo")
    assert code == 0 and out.splitlines() == ["max_num_seqs: 3 -> 2", "applied: now version 7"]
    code, _, err = ctl("rollback", "latest")
    assert code == 2 and "'latest' is not a version number or 'previous'" in err


def test_ctl_refusals_from_the_real_server(live, ctl, monkeypatch):
    monkeypatch.setenv("BATCHPILOT_URL", live)
    version = json.loads(ctl("get", "--json")[1])["version"]
    code, out, err = ctl("set", "max_num_seqs=0")
    assert (code, out) == (2, "") and "max_num_seqs" in err and "400" in err
    code, _, err = ctl("set", "max_num_seqs=4", "--if-match", str(version + 7))
    assert code == 2
    assert f"changed since version {version + 7} (now {version}): get it again" in err
    assert ctl("profile", "nope")[0] == 1
    code, _, err = ctl("rollback", "999")
    assert code == 1 and "no version 999" in err
    assert json.loads(ctl("get", "--json")[1])["version"] == version  # nothing changed
    assert ctl("drain", "--reason", "deploy")[1] == "admission: draining\n"
    assert "admission draining" in ctl("get")[1]
    assert ctl("resume")[1] == "admission: open\n"


def test_ctl_tokens_against_the_real_server(tiny_loaded, tmp_path, ctl, monkeypatch):
    from fixtures.serving import LiveServer, make_engine

    tokens = tmp_path / "tokens"
    tokens.write_text("alice admin adm1n-secret\ngrafana read r3ad-secret\n")
    engine, _, settings = make_engine(tiny_loaded)
    with LiveServer(engine, settings.replace(control_tokens_path=str(tokens))) as url:
        monkeypatch.setenv("BATCHPILOT_URL", url)
        code, _, err = ctl("get")
        assert code == 3 and "$BATCHPILOT_TOKEN is not set" in err
        monkeypatch.setenv("BATCHPILOT_TOKEN", "r3ad-secret")
        assert ctl("get")[0] == 0
        code, _, err = ctl("set", "max_num_seqs=3")
        assert code == 3 and "read-only" in err and "may only read" in err
        monkeypatch.setenv("OPS_TOKEN", "adm1n-secret")
        code, out, _ = ctl("--token-env", "OPS_TOKEN", "set", "max_num_seqs=3")
        assert code == 0 and "applied" in out
        assert ctl("history")[1].splitlines()[-1].split()[3] == "alice"
