"""The OpenTelemetry flags `batchpilot serve` and `batchpilot fleet` share."""

from __future__ import annotations

import argparse
from typing import Any

from control.otel.settings import PROTOCOLS


def add_otlp_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--otlp-traces-endpoint", metavar="URL",
                        help="export a trace per request (OTLP) to this collector, e.g."
                        " http://127.0.0.1:4318/v1/traces, or 127.0.0.1:4317 with --otlp-"
                        "protocol grpc (docs/opentelemetry.md); default: no export")
    parser.add_argument("--otlp-protocol", choices=PROTOCOLS, default="http/protobuf",
                        help="default %(default)s")
    parser.add_argument("--otlp-sample-ratio", type=float, default=1.0, metavar="R",
                        help="share of requests without a sampled traceparent that are"
                        " exported (errors, timeouts and slow ones always are; default"
                        " %(default)s)")
    parser.add_argument("--otlp-slow-ttft-s", type=float, default=None, metavar="S",
                        help="always export requests whose time to first token passed S")


def otlp_settings(args: argparse.Namespace) -> dict[str, Any]:
    """ServeSettings keyword arguments from the parsed flags."""
    return {"otlp_traces_endpoint": args.otlp_traces_endpoint,
            "otlp_protocol": args.otlp_protocol, "otlp_sample_ratio": args.otlp_sample_ratio,
            "otlp_slow_ttft_s": args.otlp_slow_ttft_s}
