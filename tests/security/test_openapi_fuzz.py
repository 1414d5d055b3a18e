"""No request of any shape is answered with a server error (issue #29): schemathesis'
positive and negative cases for every operation in /openapi.json, against the ASGI app over
the tiny model with an admin token and a trace, each checked for no 5xx and no exception in
the server's log. `python -m bench.openapi_fuzz` runs the same fuzzer at tens of thousands
of cases; this runs a few per operation, the same ones every time (derandomized).
"""

from __future__ import annotations

import math

from fixtures.requires import require_module
from fixtures.serving import make_engine

# before bench.openapi_fuzz, which imports it
require_module("schemathesis", "pip install -e '.[test]'")

from bench.openapi_fuzz import EXCLUDED, FUZZ_ENGINE, fuzz_app, fuzz_settings  # noqa: E402
from control.api.app import create_app  # noqa: E402
from control.api.errors import install_error_handlers  # noqa: E402

CASES_PER_OPERATION = 12  # about 250 cases (inputless operations get 1), ~9 s on 2 cores


def test_no_operation_answers_a_server_error(tiny_loaded, tmp_path):
    settings = fuzz_settings("tiny", tmp_path)
    engine, _, settings = make_engine(tiny_loaded, settings=settings, **FUZZ_ENGINE)
    app = create_app(settings, engine)
    operations = {f"{method.upper()} {path}" for path, item in app.openapi()["paths"].items()
                  for method in item} - {f"{m} {p}" for m, p in EXCLUDED}

    report = fuzz_app(app, CASES_PER_OPERATION)  # stops the engine when done

    assert set(report.cases) == operations, "every operation was fuzzed"
    failures = [f"{f.status} x{f.count} {f.operation}: {f.error}\n    {f.reproducer[:500]}"
                for f in report.failures.values()]
    assert not failures, "server errors:\n" + "\n".join(failures)


def test_the_fuzzer_reports_a_server_error_with_its_request():
    # the fuzzer itself can fail: a route that takes the square root of its path parameter
    # answers 500 for a negative one (the server's catch-all handler logs it), and only then
    from fastapi import FastAPI

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/root/{number}")
    def root(number: int) -> dict:
        return {"root": math.sqrt(number)}

    report = fuzz_app(app, 40)

    [failure] = report.failures.values()  # one bug, however many cases hit it
    assert failure.status == 500 and failure.operation == "GET /root/{number}"
    assert failure.error.startswith("ValueError") and "/root/-" in failure.reproducer
    assert failure.count > 1
