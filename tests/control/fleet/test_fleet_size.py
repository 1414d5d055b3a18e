"""`batchpilot fleet`'s size flags read into the slots to deploy and the autoscaling config
(control/fleet/cli.py fleet_size), without Ray: the parser and the function alone."""

from __future__ import annotations

import argparse

from control.fleet.cli import add_fleet_parser, fleet_size


def size(*flags: str):
    parser = argparse.ArgumentParser()
    add_fleet_parser(parser.add_subparsers())
    return fleet_size(parser.parse_args(["fleet", *flags]))


def test_a_fixed_fleet_is_two_replicas_unless_told():
    assert size() == (2, None)
    assert size("--replicas", "5") == (5, None)


def test_an_autoscaled_fleet_starts_from_one_replica_and_takes_its_settings():
    slots, cfg = size("--max-replicas", "3", "--autoscale", "up_waiting=5",
                      "--autoscale", "downscale_delay_s=60")
    assert slots == 3 and (cfg.min_replicas, cfg.max_replicas) == (1, 3)
    assert cfg.up_waiting == 5.0 and cfg.downscale_delay_s == 60.0
    assert size("--min-replicas", "2", "--max-replicas", "3")[1].min_replicas == 2
