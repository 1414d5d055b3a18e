"""`batchpilot` command line. Subcommands: `serve` (more arrive with later issues: trace,
ctl, loadtest, dashboard, checklist).

    batchpilot serve --model smollm2-135m --config serving.yaml --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import argparse
import logging
import sys

from control.settings import DEFAULT_MODEL, ServeSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchpilot", description="An LLM serving engine whose scheduler an operator can"
        " see and steer.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API",
                           description="Load a model and serve /v1/completions,"
                           " /v1/chat/completions, /v1/models, /healthz and /readyz.")
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
                       help="DuckDB file for the scheduler trace. Accepted now but NOT used"
                       " yet: the trace writer arrives with a later issue, and nothing is"
                       " written to PATH by this version")
    serve.add_argument("--served-model-name", help="the model id clients send and"
                       " /v1/models shows (default: the --model's last path part)")
    serve.add_argument("--device", help="cpu or cuda[:N] (default: cuda when available)")
    serve.add_argument("--shutdown-grace-s", type=float, default=30.0,
                       help="on SIGTERM, how long in-flight requests may run before they are"
                       " cancelled (default %(default)s)")
    serve.add_argument("--max-request-timeout-s", type=float, default=600.0,
                       help="cap and default of a request's X-Request-Timeout-Ms"
                       " (default %(default)s)")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=_serve)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from control.bootstrap import read_serving_config
    from engine.models import resolve_model_source

    settings = ServeSettings(
        model=args.model, config_path=args.config_path, host=args.host, port=args.port,
        served_model_name=args.served_model_name, trace_db=args.trace_db,
        device=args.device, shutdown_grace_s=args.shutdown_grace_s,
        max_request_timeout_s=args.max_request_timeout_s, log_level=args.log_level)
    try:  # fail before binding a port or loading anything
        settings.validate()
        read_serving_config(settings.config_path)
        resolve_model_source(settings.model)
    except (ValueError, FileNotFoundError) as exc:
        print(f"batchpilot serve: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.trace_db:
        logging.getLogger("batchpilot").warning(
            "--trace-db %s is accepted but not used yet: no trace is written", settings.trace_db)
    from control.server import serve

    return serve(settings)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
