"""`batchpilot` command line: bad input fails fast with a message and exit code 2."""

from __future__ import annotations

import pytest

from control.cli.main import main
from control.serve.server import READY_LINE, banner


def test_no_subcommand_prints_help(capsys):
    assert main([]) == 2
    assert "serve" in capsys.readouterr().out


def test_serve_help_lists_the_trace_and_metrics_options(capsys):
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--trace-db", "--trace-max-age", "--trace-max-mb", "--kv-snapshot-every",
                 "--metrics-tenants"):
        assert flag in out


def test_a_trace_db_in_a_missing_directory_fails_before_anything_loads(capsys, tmp_path):
    db = tmp_path / "nowhere" / "trace.duckdb"
    assert main(["serve", "--model", "smollm2-135m", "--trace-db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and str(tmp_path / "nowhere") in err


def test_a_bad_retention_duration_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        main(["serve", "--trace-max-age", "soon"])
    assert done.value.code == 2
    assert "not a duration" in capsys.readouterr().err


def test_a_hub_name_fails_before_anything_loads(capsys):
    assert main(["serve", "--model", "meta-llama/Llama-3-8B", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "meta-llama/Llama-3-8B" in err and "smollm2-135m" in err


def test_a_bad_config_names_the_field(tmp_path, capsys):
    config = tmp_path / "serving.yaml"
    config.write_text("serving:\n  kv_cache_high_watermark: 0.99\n")
    assert main(["serve", "--config", str(config), "--port", "0"]) == 2
    assert "kv_cache_high_watermark=0.99" in capsys.readouterr().err
    config.write_text("serving:\n  max_num_seq: 4\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert "unknown key(s) ['max_num_seq']" in capsys.readouterr().err


def test_bad_settings_are_refused(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "port=70000" in capsys.readouterr().err


def test_the_ready_banner_gives_the_url_and_a_curl():
    text = banner("http://127.0.0.1:8123", "smollm2-135m")
    assert text.startswith(f"{READY_LINE}: serving smollm2-135m at http://127.0.0.1:8123")
    assert "curl -s http://127.0.0.1:8123/v1/chat/completions" in text


def test_a_public_address_without_control_tokens_is_refused(capsys, monkeypatch):
    monkeypatch.delenv("BATCHPILOT_CONTROL_TOKENS", raising=False)
    assert main(["serve", "--model", "smollm2-135m", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--control-tokens" in err and "--no-control-api" in err


def test_serve_options_reach_the_server_settings_in_their_units(monkeypatch):
    """--trace-max-mb is MiB, a 'd' in --trace-max-age is days, --no-watch-config is off."""
    from control.serve import preflight, server

    started = []
    monkeypatch.setattr(preflight, "preflight", lambda settings: None)
    monkeypatch.setattr(preflight, "configure_logging", lambda level: None)
    monkeypatch.setattr(server, "serve", lambda settings: started.append(settings) or 0)
    assert main(["serve", "--trace-db", "t.duckdb", "--trace-max-mb", "2",
                 "--trace-max-age", "7d", "--no-watch-config"]) == 0
    (settings,) = started
    assert settings.trace_max_bytes == 2 * 1024 * 1024
    assert settings.trace_max_age_s == 7 * 24 * 3600
    assert settings.watch_config is False
    assert main(["serve", "--trace-max-age", "30m"]) == 0
    assert started[-1].trace_max_age_s == 1800 and started[-1].watch_config is True
