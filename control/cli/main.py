"""`batchpilot` command line. Subcommands: `serve`, `trace` (control/trace/cli.py), `ctl`
(control/cli/ctl.py), `loadtest` (control/loadtest/cli.py), `dashboard`
(control/cli/dashboard.py), `checklist` (control/checklist/), `fleet`
(control/fleet/cli.py).

    batchpilot serve --model smollm2-135m --config serving.yaml --host 127.0.0.1 --port 8000
    batchpilot trace --url http://127.0.0.1:8000 slow --since -15m
    batchpilot ctl --url http://127.0.0.1:8000 set max_num_seqs=64 --reason "incident 42"
    batchpilot loadtest --scenario playbooks/scenarios/chat.yaml --url http://127.0.0.1:8000
    batchpilot dashboard --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import re
import sys

from control.checklist.cli import add_checklist_parser
from control.cli.ctl import add_ctl_parser
from control.cli.dashboard import add_dashboard_parser
from control.fleet.cli import add_fleet_parser
from control.loadtest.cli import add_loadtest_parser
from control.otel.cli_args import add_otlp_args, otlp_settings
from control.serve.settings import COMPAT_MODES, DEFAULT_MODEL, EDGE_MODES, ServeSettings
from control.trace.cli import add_trace_parser
from control.whatif.cli import add_whatif_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchpilot", description="An LLM serving engine whose scheduler an operator can"
        " see and steer.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API",
                           description="Load a model and serve /v1/completions,"
                           " /v1/chat/completions, /v1/models, /healthz and /readyz, and"
                           " vLLM's /health, /version, /tokenize and /detokenize.")
    serve.add_argument("--model", default=DEFAULT_MODEL,
                       help="alias, checkpoint directory or .gguf file (default %(default)s);"
                       " nothing is downloaded from a model hub")
    serve.add_argument("--config", dest="config_path", metavar="YAML",
                       help="serving config (budgets, lanes, profiles); default: the embedded"
                       " defaults fitted to the model")
    serve.add_argument("--host", default="127.0.0.1", help="default %(default)s")
    serve.add_argument("--port", type=int, default=8000,
                       help="default %(default)s; 0 picks a free port (printed when ready)")
    serve.add_argument("--trace-db", metavar="PATH",
                       help="DuckDB file for the scheduler trace (steps, requests, KV"
                       " snapshots, admissions); created if missing, appended to if not."
                       " Default: no trace")
    serve.add_argument("--trace-max-age", metavar="DURATION", type=_duration,
                       help="retention: delete trace rows older than this (e.g. 30m, 12h,"
                       " 7d; default: keep)")
    serve.add_argument("--trace-max-mb", metavar="MB", type=float,
                       help="retention: keep the trace file under about this size (default:"
                       " no limit)")
    serve.add_argument("--kv-snapshot-every", metavar="STEPS", type=int, default=50,
                       help="steps between KV snapshots in the trace, besides one at every"
                       " watermark crossing (default %(default)s)")
    serve.add_argument("--metrics-tenants", metavar="A,B,...", type=_names, default=(),
                       help="tenants that get their own metrics label; the rest count as"
                       " 'other' (default: only 'default')")
    serve.add_argument("--metrics-compat", choices=list(COMPAT_MODES), default=None,
                       help="vllm: also export the gateway gauges and the main histograms"
                       " and counters under vLLM's names (vllm:*, label model_name), for"
                       " routers that read only those (docs/gateways.md); otel: also the"
                       " OpenTelemetry GenAI server histograms (gen_ai_server_*,"
                       " docs/opentelemetry.md); off by default, so dashboards do not count"
                       " twice")
    add_otlp_args(serve)
    serve.add_argument("--control-tokens", metavar="FILE",
                       help="tokens for the control API, trace, what-if and load-test"
                       " routes: lines 'name scope secret [tenant,...]' (scope read or"
                       " admin; colons may stand for the spaces) or a .yaml file; also"
                       " $BATCHPILOT_CONTROL_TOKENS (docs/security.md). Without any, those"
                       " routes are open and the server must bind loopback")
    serve.add_argument("--no-control-api", action="store_true",
                       help="serve without the /control API")
    serve.add_argument("--no-watch-config", action="store_true",
                       help="do not reload --config when the file changes (SIGHUP still"
                       " reloads it)")
    serve.add_argument("--served-model-name", help="the model id clients send and"
                       " /v1/models shows (default: the --model's last path part)")
    serve.add_argument("--device", help="cpu or cuda[:N] (default: cuda when available)")
    serve.add_argument("--dtype", default="auto", metavar="{auto,float32,bfloat16}",
                       help="weight dtype (default auto: bfloat16 on CUDA; on a CPU with"
                       " AMX or AVX-512-BF16, float32 plus bf16 projections (for every"
                       " step where the native decode layers build, else for batched"
                       " steps); else float32)")
    serve.add_argument("--shutdown-grace-s", type=float, default=30.0,
                       help="on SIGTERM, how long in-flight requests may run before they are"
                       " cancelled (default %(default)s)")
    serve.add_argument("--max-request-timeout-s", type=float, default=600.0,
                       help="cap and default of a request's X-Request-Timeout-Ms"
                       " (default %(default)s)")
    serve.add_argument("--limit", action="append", metavar="NAME=VALUE", default=[],
                       help="a bound on what one request may ask for (repeatable), e.g."
                       " max_body_bytes=1048576; the limits and their defaults:"
                       " docs/security.md")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug"],
                       help="the server's log and uvicorn's (default %(default)s)")
    serve.add_argument("--edge", choices=list(EDGE_MODES), default="auto",
                       help="parse and validate request bodies in a process of their own,"
                       " so malformed requests do not slow the engine's (docs/security.md);"
                       " auto (default): on when --host is not loopback")
    serve.set_defaults(func=_serve)
    add_trace_parser(sub)
    add_ctl_parser(sub)
    add_loadtest_parser(sub)
    add_dashboard_parser(sub)
    add_checklist_parser(sub)
    add_whatif_parser(sub)
    add_fleet_parser(sub)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from control.api.limits import RequestLimits, parse_limit_args
    from control.serve.preflight import configure_logging, preflight

    settings = ServeSettings(
        model=args.model, config_path=args.config_path, host=args.host, port=args.port,
        served_model_name=args.served_model_name, trace_db=args.trace_db,
        trace_max_age_s=args.trace_max_age, kv_snapshot_every=args.kv_snapshot_every,
        trace_max_bytes=int(args.trace_max_mb * 2**20) if args.trace_max_mb else None,
        metrics_tenants=args.metrics_tenants, metrics_compat=args.metrics_compat,
        control_api=not args.no_control_api,
        control_tokens_path=args.control_tokens, watch_config=not args.no_watch_config,
        device=args.device, dtype=args.dtype, shutdown_grace_s=args.shutdown_grace_s,
        max_request_timeout_s=args.max_request_timeout_s, log_level=args.log_level,
        edge=args.edge)
    try:  # fail before binding a port or loading anything
        settings = settings.replace(limits=RequestLimits().with_values(
            parse_limit_args(args.limit)), **otlp_settings(args, args.config_path))
        preflight(settings)
    except (ValueError, FileNotFoundError) as exc:
        print(f"batchpilot serve: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    from control.serve.server import serve

    return serve(settings)


def _duration(text: str) -> float:
    """'90', '90s', '30m', '12h', '7d' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; use e.g. 90s, 30m, 12h or 7d") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


TIME_OPTIONS = ("--since", "--until", "--at")


def relative_times(argv: list[str]) -> list[str]:
    """`--since -15m` as `--since=-15m`: argparse takes a value that starts with '-' and
    a digit-and-unit for an option, and the runbooks' relative times look like that."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in TIME_OPTIONS and re.fullmatch(r"-\d+(\.\d+)?[smhd]?", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(relative_times(sys.argv[1:] if argv is None else argv))
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
