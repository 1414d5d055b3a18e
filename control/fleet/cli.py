"""`batchpilot fleet`: N engine replicas behind one OpenAI-compatible URL, on Ray Serve.

    batchpilot fleet --replicas 2 --config serving.yaml                 # local Ray
    batchpilot fleet --replicas 8 --config serving.yaml --address auto  # join a cluster
    batchpilot fleet --min-replicas 1 --max-replicas 2   # Serve's autoscaler, our signals
    batchpilot fleet restart --url http://INGRESS --grace 30  # rolling restart (restart_cli)
    batchpilot fleet autoscale --url http://INGRESS [--set NAME=VALUE]  # (autoscale_cli)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from control.fleet.autoscale import AutoscaleConfig, parse_settings
from control.fleet.autoscale_cli import add_autoscale_parser
from control.fleet.restart_cli import add_restart_parser
from control.fleet.router import MODES, RoutingPolicy
from control.otel.cli_args import add_otlp_args, otlp_settings
from control.serve.settings import DEFAULT_MODEL, ServeSettings


def add_fleet_parser(sub: argparse._SubParsersAction) -> None:
    fleet = sub.add_parser(
        "fleet", help="serve N engine replicas behind one URL (Ray Serve)",
        description="Start (or join) Ray, run N replicas of the engine (one GPU each where"
        " there are GPUs) and one ingress serving the OpenAI API, /healthz, /readyz and"
        " /metrics; requests go to the replica likely to hold their prompt prefix unless it"
        " is much busier than the others (docs/fleet.md). Needs the `fleet` extra:"
        " pip install 'batchpilot[fleet]'.")
    fleet.add_argument("--replicas", type=int, default=None,
                       help="a fixed fleet of this many (default 2; not with --max-replicas)")
    fleet.add_argument("--min-replicas", type=int, default=None,
                       help="autoscaled: at least this many (default 1)")
    fleet.add_argument("--max-replicas", type=int, default=None,
                       help="autoscaled: at most this many (docs/fleet.md, Autoscaling)")
    fleet.add_argument("--autoscale", action="append", metavar="NAME=VALUE", default=[],
                       help="an autoscaling setting (up_waiting, up_queue_share,"
                       " up_kv_usage, down_running, down_kv_usage, upscale_delay_s,"
                       " downscale_delay_s); live: PATCH /control/fleet/autoscale")
    fleet.add_argument("--model", default=DEFAULT_MODEL, help="default %(default)s")
    fleet.add_argument("--config", dest="config_path", metavar="YAML",
                       help="serving config every replica runs (default: embedded)")
    fleet.add_argument("--address", help="Ray cluster to join (e.g. auto, ray://HOST:10001);"
                       " default: start a local Ray")
    fleet.add_argument("--num-cpus", type=float, help="local Ray's CPUs (default: all)")
    fleet.add_argument("--replica-cpus", type=float, default=None,
                       help="CPUs reserved per replica when there is no GPU (default: an"
                       " equal share of what the ingress's 0.5 leaves, e.g. 0.75 each for"
                       " 2 replicas on 2 cores; fractions share cores)")
    fleet.add_argument("--host", default="127.0.0.1", help="default %(default)s")
    fleet.add_argument("--port", type=int, default=8000, help="default %(default)s")
    fleet.add_argument("--routing", choices=MODES, default="affinity",
                       help="affinity (default: tenant + the prompt's first 256 characters),"
                       " precise (where each replica's KV events say the prompt's blocks"
                       " are; the ingress loads the tokenizer), or the baselines pow2 and"
                       " random")
    fleet.add_argument("--max-imbalance", type=int, default=RoutingPolicy.max_imbalance,
                       help="requests the prefix's replica may carry over the least loaded"
                       " before a request goes elsewhere (default %(default)s)")
    fleet.add_argument("--trace-dir", metavar="DIR",
                       help="each replica writes DIR/replica-<id>.duckdb (default: no trace)")
    add_otlp_args(fleet)
    fleet.add_argument("--control-tokens", metavar="FILE",
                       help="control API tokens, as for `batchpilot serve`")
    fleet.add_argument("--no-control-api", action="store_true",
                       help="replicas serve without the /control API")
    fleet.add_argument("--shutdown-grace-s", type=float, default=30.0,
                       help="on SIGTERM, how long in-flight requests may run (default"
                       " %(default)s)")
    fleet.add_argument("--limit", action="append", metavar="NAME=VALUE", default=[],
                       help="a bound on what one request may ask for, as for `batchpilot"
                       " serve` (the ingress and every replica; docs/security.md)")
    fleet.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug"],
                       help="this process's log (default %(default)s)")
    fleet.set_defaults(func=run_fleet)
    commands = fleet.add_subparsers(dest="fleet_command", metavar="{restart,autoscale}")
    add_restart_parser(commands)
    add_autoscale_parser(commands)


def run_fleet(args: argparse.Namespace) -> int:
    from control.api.limits import RequestLimits, parse_limit_args
    from control.serve.preflight import configure_logging, preflight

    serve = ServeSettings(model=args.model, config_path=args.config_path, host=args.host,
                          port=args.port, control_tokens_path=args.control_tokens,
                          control_api=not args.no_control_api,
                          shutdown_grace_s=args.shutdown_grace_s, log_level=args.log_level)
    try:
        import ray  # noqa: F401  (the optional extra)
    except ImportError:
        print("batchpilot fleet: error: Ray Serve is not installed; pip install"
              " 'batchpilot[fleet]' (or 'ray[serve]>=2.40')", file=sys.stderr)
        return 2
    from control.fleet.app import FleetSettings, run

    try:
        replicas, autoscale = fleet_size(args)
    except ValueError as exc:
        print(f"batchpilot fleet: error: {exc}", file=sys.stderr)
        return 2
    settings = FleetSettings(serve, replicas=replicas, autoscale=autoscale,
                             address=args.address,
                             num_cpus=args.num_cpus, replica_cpus=args.replica_cpus,
                             trace_dir=args.trace_dir, policy=RoutingPolicy(
                                 mode=args.routing, max_imbalance=args.max_imbalance))
    try:  # fail before starting Ray or loading anything; every replica serves /control:
        serve = serve.replace(limits=RequestLimits().with_values(parse_limit_args(args.limit)),
                              **otlp_settings(args, args.config_path))
        settings = dataclasses.replace(settings, serve=serve)
        settings.validate()  # the same rule as `batchpilot serve` (tokens, or loopback)
        preflight(serve)
        if args.trace_dir:  # each replica opens its file there; a missing folder failed them
            make_trace_dir(args.trace_dir)
    except (ValueError, FileNotFoundError) as exc:
        print(f"batchpilot fleet: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    return run(settings)


def fleet_size(args: argparse.Namespace) -> tuple[int, AutoscaleConfig | None]:
    """(slots to deploy, the autoscaling config or None) from the size flags; ValueError
    naming the flag when they disagree or a setting is wrong."""
    scaled = args.max_replicas is not None or args.min_replicas is not None
    if not scaled:
        if args.autoscale:
            raise ValueError("--autoscale needs --max-replicas (an autoscaled fleet)")
        return (2 if args.replicas is None else args.replicas), None
    if args.replicas is not None:
        raise ValueError("--replicas is a fixed size: use --min-replicas and --max-replicas"
                         " for an autoscaled fleet, not both")
    if args.max_replicas is None:
        raise ValueError("--min-replicas needs --max-replicas")
    changes = parse_settings(args.autoscale, "--autoscale")
    base = AutoscaleConfig(1 if args.min_replicas is None else args.min_replicas,
                           args.max_replicas)
    if {"min_replicas", "max_replicas"} & set(changes):
        raise ValueError("--autoscale sets thresholds and delays; the size is"
                         " --min-replicas / --max-replicas")
    return args.max_replicas, base.validate().replace(changes)


def make_trace_dir(path: str) -> None:
    """--trace-dir created (parents too) before Ray starts; ValueError saying why not."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--trace-dir {path!r} cannot be created: {exc.strerror}") from None
