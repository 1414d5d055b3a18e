"""`batchpilot fleet` refuses bad settings before it starts Ray or loads a model."""

from __future__ import annotations

import pytest
from fixtures.requires import require_module

from control.cli.main import main


@pytest.mark.parametrize("args, message", [
    (["--replicas", "0"], "replicas=0 must be >= 1"),
    (["--replica-cpus", "0"], "replica_cpus=0.0 and ingress_cpus=0.5 must be > 0"),
    (["--port", "70000"], "port=70000 must be in 0..65535"),
    (["--host", "0.0.0.0"], "0.0.0.0"),  # /control open beyond loopback without tokens
    (["--min-replicas", "2", "--max-replicas", "1"], "must satisfy 1 <= min <= max"),
    (["--min-replicas", "1"], "--min-replicas needs --max-replicas"),
    (["--replicas", "2", "--max-replicas", "3"], "not both"),
    (["--autoscale", "up_waiting=2"], "--autoscale needs --max-replicas"),
    (["--max-replicas", "2", "--autoscale", "up_waiting"], "'up_waiting' must be NAME=NUMBER"),
    (["--max-replicas", "2", "--autoscale", "up_waiting=lots"],
     "'up_waiting=lots' must be NAME=NUMBER"),
    (["--max-replicas", "2", "--autoscale", "up_wait=2"], "unknown autoscale setting"),
    (["--max-replicas", "2", "--autoscale", "max_replicas=3"], "the size is --min-replicas"),
    (["--max-replicas", "2", "--autoscale", "up_kv_usage=2"], "up_kv_usage=2.0 must be in"),
])
def test_fleet_rejects_bad_settings_with_an_actionable_message(args, message, capsys,
                                                              tiny_llama_dir):
    require_module("ray", "pip install -e '.[fleet]'")
    assert main(["fleet", "--model", str(tiny_llama_dir), *args]) == 2
    assert message in capsys.readouterr().err


def test_fleet_is_a_subcommand_with_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["fleet", "--help"])
    out = capsys.readouterr().out
    for option in ("--replicas", "--address", "--config", "--routing", "--max-imbalance",
                   "--min-replicas", "--max-replicas", "--autoscale"):
        assert option in out
