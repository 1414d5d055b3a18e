"""Property fuzzing of the server's whole OpenAPI schema: no request, valid or not, is
answered with a server error (schemathesis' `not_a_server_error`: no 5xx), and none makes
the server log an unhandled exception.

Every operation in /openapi.json (but EXCLUDED) gets schemathesis' positive cases (bodies,
queries and paths that fit the schema) and negative ones (that break it), half each, sent
in process to the ASGI app over the tests' tiny Llama with a trace database and an admin
token (admin sees every route: read routes too). Each distinct failure — operation,
status, and the exception the server logged (type and where it was raised) — is reported
once, with the shortest request that caused it as a curl command (host http://testserver).

    python -m bench.openapi_fuzz [--cases 20000] [--seed 0]
    python -m bench.openapi_fuzz --smoke       # 136 cases (4 per operation)

Last line: one JSON object: cases per operation, seconds, the failures. tests/security runs
the same `fuzz_app` at a small count.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import re
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ADMIN_SECRET = "fuzz-admin-s3cret"
AUTH = {"Authorization": f"Bearer {ADMIN_SECRET}"}
TOKEN_LINE = f"fuzzer admin {ADMIN_SECRET}\n"  # control/admin/auth.py: "name scope secret"
# Operations left out, each with why: fuzzing them measures nothing but the exclusion.
EXCLUDED = {
    # drains the server: every later generation answers 503 by design, for the rest of
    # the run (POST /control/resume stays in: it is a no-op on a serving server)
    ("POST", "/control/drain"),
}
# Generations stay short whatever the fuzzer asks for (n up to 16 x max_tokens): a case
# costs milliseconds, so a run covers many cases, not a few long decodes.
FUZZ_ENGINE = {"max_model_len": 256, "num_kv_blocks": 512}
CALL_TIMEOUT_S = 60.0  # past it a case is a failure: the server hung on it
SMOKE = {"cases": 136}
SERVER_LOGGERS = ("batchpilot", "uvicorn.error")  # where unhandled exceptions are logged


@dataclass
class Failure:
    """One distinct failure: how many cases hit it, and the shortest of them."""

    operation: str
    status: int | str  # HTTP status, or "timeout" / "logged" (a 2xx-4xx with a traceback)
    error: str  # the logged exception, "Type: message @ file:line"; "" if none was logged
    reproducer: str
    count: int = 0


@dataclass
class FuzzReport:
    cases: Counter = field(default_factory=Counter)  # operation -> cases sent
    unsendable: int = 0  # cases the HTTP client refused to send (e.g. a header with \n)
    failures: dict[tuple, Failure] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"cases": sum(self.cases.values()), "operations": len(self.cases),
                "unsendable": self.unsendable, "seconds": round(self.seconds, 1),
                "cases_per_operation": dict(sorted(self.cases.items())),
                "failures": [vars(f) for f in self.failures.values()]}


class _LoggedErrors(logging.Handler):
    """Collects the exceptions the server logs (CatchAllMiddleware, uvicorn) as one-line
    keys: the type, its message's start and the innermost frame."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{Path(frame.filename).name}:{frame.lineno}"
            self.errors.append(f"{type(exc).__name__}: {str(exc)[:120]} @ {where}")
        else:
            self.errors.append(record.getMessage()[:160])


def _bug(error: str) -> str:
    """What identifies a bug in a logged error: its type and where it was raised, or, for
    a line without a traceback, the line with its numbers and ids blanked (step 564)."""
    if " @ " in error:
        return error.split(":", 1)[0] + " @ " + error.rsplit(" @ ", 1)[1]
    return re.sub(r"[0-9a-f]{12,}|\d+", "#", error)


def _check_case(case: Any, report: FuzzReport, logged: _LoggedErrors) -> None:
    """Send one case; a 5xx, a timeout or a logged exception is recorded as a failure."""
    import requests

    operation = f"{case.operation.method.upper()} {case.operation.path}"
    report.cases[operation] += 1
    logged.errors.clear()
    try:
        status: int | str = case.call(headers=AUTH, timeout=CALL_TIMEOUT_S).status_code
    except requests.exceptions.ReadTimeout:
        status = "timeout"
    except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL,
            UnicodeEncodeError):
        report.unsendable += 1  # the client's refusal, not the server's answer
        return
    if isinstance(status, int) and status < 500 and not logged.errors:
        return
    if isinstance(status, int) and status < 500:
        status = f"logged ({status})"
    # a traceback's line says more than the engine loop's "failed again" lines after it
    error = next((e for e in logged.errors if " @ " in e), logged.errors[0] if logged.errors
                 else "")
    key = (operation, status, _bug(error))
    reproducer = case.as_curl_command(headers=AUTH)
    failure = report.failures.setdefault(key, Failure(operation, status, error, reproducer))
    failure.count += 1
    if len(reproducer) < len(failure.reproducer):
        failure.reproducer = reproducer


def fuzz_app(app: Any, cases_per_operation: int, seed: int | None = None) -> FuzzReport:
    """Fuzz every operation of `app` (an ASGI app from control.api.app.create_app, with
    the token in TOKEN_LINE) with `cases_per_operation` cases, half positive and half
    negative. seed None: Hypothesis derandomized (the same cases every run, for CI)."""
    import hypothesis
    import schemathesis
    from schemathesis.python import asgi

    report, logged = FuzzReport(), _LoggedErrors()
    for name in SERVER_LOGGERS:
        logging.getLogger(name).addHandler(logged)
    started = time.perf_counter()
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        # reproducers in full: schemathesis masks any field named like a secret ("token")
        schema.config.output.sanitization.update(enabled=False)
        for result in schema.get_all_operations():
            operation = result.ok()
            if (operation.method.upper(), operation.path) in EXCLUDED:
                continue
            for mode in (schemathesis.GenerationMode.POSITIVE,
                         schemathesis.GenerationMode.NEGATIVE):
                examples = max(1, cases_per_operation // 2)

                @hypothesis.settings(max_examples=examples, deadline=None, database=None,
                                     derandomize=seed is None,
                                     phases=[hypothesis.Phase.generate],  # no shrinking:
                                     # the shortest failing case is kept instead
                                     suppress_health_check=list(hypothesis.HealthCheck))
                @hypothesis.given(operation.as_strategy(generation_mode=mode))
                def run(case: Any) -> None:
                    _check_case(case, report, logged)

                if seed is not None:
                    run = hypothesis.seed(seed)(run)
                # negative mode, an operation without inputs: nothing to break
                with contextlib.suppress(hypothesis.errors.Unsatisfiable):
                    run()
    finally:
        for name in SERVER_LOGGERS:
            logging.getLogger(name).removeHandler(logged)
        asgi.shutdown_lifespans()  # the app's lifespan: its engine and trace writer stop
        report.seconds = time.perf_counter() - started
    return report


def fuzz_settings(model: str, folder: Path) -> Any:
    """ServeSettings for a fuzzed server: an admin token file, a trace under `folder`."""
    from control.serve.settings import ServeSettings

    tokens = folder / "tokens.txt"
    tokens.write_text(TOKEN_LINE)
    return ServeSettings(model=model, control_tokens_path=str(tokens),
                         trace_db=str(folder / "trace.duckdb"), watch_config=False,
                         engine_overrides=dict(FUZZ_ENGINE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=20_000,
                        help="in all, spread over the operations (one without inputs: 1)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis' seed")
    parser.add_argument("--model", help="alias or checkpoint directory (default: tiny Llama)")
    parser.add_argument("--smoke", action="store_true", help=f"small counts: {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    from bench.random_models import tiny_checkpoint
    from control.api.app import create_app
    from control.serve.bootstrap import build_parts
    from control.serve.engine_loop import AsyncEngine

    with tempfile.TemporaryDirectory(prefix="bench-fuzz-") as tmp:
        model = args.model or str(tiny_checkpoint(Path(tmp) / "model"))
        settings = fuzz_settings(model, Path(tmp))
        # loaded before the first case: a case sent while it loads would be a fair 503
        engine = AsyncEngine(functools.partial(build_parts, settings),
                             stall_after_s=settings.stall_after_s)
        engine.start()
        engine.loaded.wait(300)
        if engine.parts is None:
            raise RuntimeError(f"the model did not load: {engine.load_error}")
        app = create_app(settings, engine)
        operations = len(app.openapi()["paths"])  # paths, about one operation each
        report = fuzz_app(app, max(2, args.cases // operations), seed=args.seed)
        engine.stop()
    result = {"bench": "openapi_fuzz", "smoke": args.smoke, **report.summary()}
    for failure in result["failures"]:
        print(f"{failure['status']} x{failure['count']} {failure['operation']}"
              f" {failure['error']}\n    {failure['reproducer'][:600]}")
    print(f"{result['cases']} cases over {result['operations']} operations in"
          f" {result['seconds']} s; {len(result['failures'])} distinct failures")
    print(json.dumps(result))
    return 0 if not result["failures"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
