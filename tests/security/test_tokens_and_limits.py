"""Tokens as an operator writes them (a file, YAML, the environment; bound to tenants or
not) and limits as `--limit NAME=VALUE`: what is accepted, and what is refused with a
message that says what to fix, before anything starts; each limit's default is the one
docs/security.md gives."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from control.admin.auth import ENV_VAR, Token, known_token, load_tokens
from control.api.app import create_app
from control.api.errors import APIError
from control.api.limits import RequestLimits, parse_limit_args
from control.cli.main import main
from control.serve.settings import ServeSettings

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_a_token_file_binds_read_tokens_to_tenants(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    path = tmp_path / "tokens.txt"
    path.write_text("# ops\nalice admin s3cret-alice\n"
                    "acme-ro read s3cret-acme acme,acme-eu\ngrafana:read:s3cret-graf\n")
    alice, acme, grafana = load_tokens(str(path))
    assert (alice.scope, alice.tenants) == ("admin", None)
    assert (acme.scope, acme.tenants) == ("read", ("acme", "acme-eu"))
    assert grafana.tenants is None


def test_yaml_and_environment_tokens(tmp_path, monkeypatch):
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens:\n  - {name: acme-ro, scope: read, secret: s3cret-acme,"
                    " tenants: [acme, 用户]}\n")
    monkeypatch.setenv(ENV_VAR, "alice:admin:s3cret-alice,beta-ro:read:s3cret-beta:beta,"
                                "beta-eu,carol:read:s3cret-carol")
    tokens = {t.name: t for t in load_tokens(str(path))}
    assert tokens["acme-ro"].tenants == ("acme", "用户")
    assert tokens["beta-ro"].tenants == ("beta", "beta-eu")
    assert tokens["carol"].tenants is None and tokens["alice"].scope == "admin"


@pytest.mark.parametrize("line,message", [
    ("alice admin s3cret-alice acme", "only read tokens may be bound"),
    ("bob read short", "at least 8"),
    ("bob write s3cret-bob1", "scope"),
    ("bob read s3cret-bob1 a\x01b", "printable"),
])
def test_a_bad_token_line_is_refused_with_its_reason(tmp_path, monkeypatch, line, message):
    monkeypatch.delenv(ENV_VAR, raising=False)
    path = tmp_path / "tokens.txt"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        load_tokens(str(path))


def test_limits_from_the_command_line():
    limits = RequestLimits().with_values(parse_limit_args(
        ["max_body_bytes=1024", "grammar_compile_timeout_s=0.5"]))
    assert (limits.max_body_bytes, limits.grammar_compile_timeout_s) == (1024, 0.5)
    for bad, message in ((["max_body=1"], "unknown limit"),
                         (["max_body_byts=1"], r"\(did you mean max_body_bytes\?\)"),
                         (["max_body_bytes=1.5"], "whole number"),
                         (["max_body_bytes=0"], "> 0"),
                         (["max_body_bytes"], "NAME=VALUE")):
        with pytest.raises(ValueError, match=message):
            RequestLimits().with_values(parse_limit_args(bad))


def test_a_limit_given_as_true_in_code_is_refused():
    """A server built in code (create_app validates its settings) with `max_messages=True`
    would otherwise run with a limit of 1 message, which no one meant."""
    with pytest.raises(ValueError, match="max_messages=True must be a number > 0"):
        ServeSettings(model="tiny", limits=RequestLimits(max_messages=True)).validate()


def documented_defaults() -> dict[str, str]:
    """docs/security.md's limits table: limit name -> its `default` cell."""
    rows = (DOCS / "security.md").read_text().splitlines()
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows
             if row.startswith("| `")]
    return {c[0].strip("`"): c[1] for c in cells if len(c) >= 2}


def test_every_limit_is_documented_with_the_default_it_has():
    """An operator sizes a host by the table's defaults (a body buffered, compiles at once,
    tokens one request may hold): the server must enforce what it says."""
    documented = documented_defaults()
    for f in dataclasses.fields(RequestLimits):
        assert f.name in documented, f"docs/security.md's limits table lacks {f.name}"
        if f.default is None:  # derived from the model: the cell says how
            continue
        match = re.match(r"([\d.]+)( days| s\b)?", documented[f.name])
        assert match, (f.name, documented[f.name])  # a default starts with its figure
        scale = {" days": 86400, " s": 1, None: 1}[match.group(2)]
        assert float(match.group(1)) * scale == f.default, (f.name, documented[f.name])


def test_serve_refuses_a_bad_limit_before_loading_anything(capsys):
    assert main(["serve", "--model", "nowhere", "--limit", "max_logit_bias=-3"]) == 2
    assert "max_logit_bias=-3 must be a number > 0" in capsys.readouterr().err


def test_serve_refuses_a_public_trace_without_tokens(capsys, monkeypatch, tmp_path):
    """Refused before the model loads: an empty .gguf passes the preflight's model check
    and would fail its load with another message, so a missing exposure check fails here
    at once instead of serving on 0.0.0.0 until the test's timeout."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    (tmp_path / "empty.gguf").touch()
    assert main(["serve", "--model", str(tmp_path / "empty.gguf"), "--host", "0.0.0.0",
                 "--no-control-api",
                 "--trace-db", str(tmp_path / "t.duckdb")]) == 2
    assert "trace API" in capsys.readouterr().err


def test_an_app_built_in_code_refuses_a_public_trace_without_tokens(monkeypatch, tmp_path):
    """create_app (a server run under one's own ASGI server, without `batchpilot serve`'s
    preflight) refuses it too: anyone could read every tenant's requests. Refused before it
    opens anything: no trace file is left behind (or held open by the process)."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    settings = ServeSettings(model="tiny", host="0.0.0.0", control_api=False,
                             trace_db=str(tmp_path / "t.duckdb"))
    with pytest.raises(ValueError, match="the trace API"):
        create_app(settings)
    assert not (tmp_path / "t.duckdb").exists()


@pytest.mark.parametrize("yaml_text,message", [
    ("tokens:\n  - {name: acme-ro, scope: read, secret: s3cret-acme, tenant: acme}\n",
     "keys are name, scope, secret, tenants"),  # singular: would load unbound, reading all
    ("tokens:\n  - {name: acme-ro, scope: read, secret: s3cret-acme, tenants: acme}\n",
     "tenants must be a list"),  # a string: would bind tenants a, c, m, e
    ("tokens:\n  - {name: bob, scope: read, secret: s3cret-bob1}\n"
     "  - {name: bob, scope: admin, secret: s3cret-bob2}\n", "names must be unique"),
])
def test_a_yaml_token_the_server_would_misread_is_refused(tmp_path, monkeypatch, yaml_text,
                                                          message):
    monkeypatch.delenv(ENV_VAR, raising=False)
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError, match=message):
        load_tokens(str(path))


@pytest.mark.parametrize("env,message", [
    # a name with no colon binds tenants only after a token that has begun its list
    ("grafana:read:s3cret-graf,stray", "expected 'name scope secret"),
    ("alice:admin:s3cret-alice,alice:read:s3cret-other", "names must be unique"),
])
def test_an_environment_token_list_the_server_would_misread_is_refused(monkeypatch, env,
                                                                        message):
    monkeypatch.setenv(ENV_VAR, env)
    with pytest.raises(ValueError, match=message):
        load_tokens(None)


@pytest.mark.parametrize("header", ["Basic s3cret-alice", "s3cret-alice", "Bearer ",
                                    "Bearer s3cret-other"])
def test_only_a_bearer_header_with_a_known_secret_names_a_token(header):
    tokens = (Token("alice", "admin", "s3cret-alice"),)
    assert known_token("bearer s3cret-alice", tokens).name == "alice"  # the scheme's case
    with pytest.raises(APIError) as refused:
        known_token(header, tokens)
    assert refused.value.status == 401
