"""The OpenTelemetry settings `batchpilot serve` and `batchpilot fleet` share: flags, or the
serving YAML's `telemetry:` block (a flag given on the command line wins).

    telemetry:
      otlp_traces_endpoint: http://127.0.0.1:4318/v1/traces
      otlp_protocol: http/protobuf      # or grpc
      otlp_sample_ratio: 0.1
      otlp_slow_ttft_s: 2.0
"""

from __future__ import annotations

import argparse
from typing import Any

from control.otel.settings import PROTOCOLS
from engine.config.known_keys import did_you_mean

KEYS = ("otlp_traces_endpoint", "otlp_protocol", "otlp_sample_ratio", "otlp_slow_ttft_s")


def add_otlp_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--otlp-traces-endpoint", metavar="URL",
                        help="export a trace per request (OTLP) to this collector, e.g."
                        " http://127.0.0.1:4318/v1/traces, or 127.0.0.1:4317 with --otlp-"
                        "protocol grpc (docs/opentelemetry.md); default: the YAML's"
                        " telemetry block, else no export")
    parser.add_argument("--otlp-protocol", choices=PROTOCOLS, default=None,
                        help="default http/protobuf")
    parser.add_argument("--otlp-sample-ratio", type=float, default=None, metavar="R",
                        help="share of requests without a sampled traceparent that are"
                        " exported (errors, timeouts and slow ones always are; default 1)")
    parser.add_argument("--otlp-slow-ttft-s", type=float, default=None, metavar="S",
                        help="always export requests whose time to first token passed S")


def otlp_settings(args: argparse.Namespace, config_path: str | None) -> dict[str, Any]:
    """ServeSettings keyword arguments: each flag given, else the YAML's value (ValueError
    naming a key the block does not know, or a block that is not a mapping)."""
    from_yaml = telemetry_block(config_path) if config_path else {}
    given = {key: getattr(args, key) for key in KEYS if getattr(args, key) is not None}
    return {**from_yaml, **given}


def telemetry_block(config_path: str) -> dict[str, Any]:
    from engine.config.yaml_loader import read_yaml_file

    data = read_yaml_file(config_path)
    block = data.get("telemetry") if isinstance(data, dict) else None
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise ValueError(f"telemetry in {config_path} must be a mapping of {', '.join(KEYS)}")
    unknown = sorted(set(block) - set(KEYS))
    if unknown:
        raise ValueError(f"telemetry: unknown key(s) {unknown} in {config_path}"
                         f"{did_you_mean(unknown, KEYS)}; allowed: {', '.join(KEYS)}")
    return dict(block)
