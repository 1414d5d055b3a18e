"""Checks that fail a start before a port is bound, Ray is started or a model is loaded:
the same for `batchpilot serve` and every replica of `batchpilot fleet`."""

from __future__ import annotations

import logging

from control.serve.settings import LOOPBACK_HOSTS, ServeSettings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def preflight(settings: ServeSettings) -> None:
    """Raises ValueError or FileNotFoundError saying what is wrong: the serving YAML (what
    needs no model; checks against the fitted max_model_len and KV pool fail the start once
    the model is loaded, see control/serve/bootstrap.py), the model source, the trace file
    (another process may hold it), and the control API's exposure rule (tokens, or bound
    to loopback). `settings.validate()` runs first."""
    from control.admin.auth import check_exposure, load_tokens
    from control.serve.bootstrap import read_serving_config
    from control.trace.store import check_trace_db
    from engine.models import resolve_model_source

    settings.validate()
    read_serving_config(settings.config_path)
    resolve_model_source(settings.model)
    check_trace_db(settings.trace_db)
    check_exposure(settings.host, load_tokens(settings.control_tokens_path), LOOPBACK_HOSTS,
                   control_api=settings.control_api, trace=bool(settings.trace_db))


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
