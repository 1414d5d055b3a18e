"""The names the docs give a reader to type or look for exist in the code.

- every `batchpilot_*` metric README.md, docs/ and the playbooks name is one the code
  defines (a string literal in control/, with or without the prefix; a name the docs grep
  for may be a prefix of one);
- every HTTP path they name (`/v1/...`, `/control/...`, the probes) is a route of the
  server or of the fleet's ingress, or a prefix of routes at a `/` (the `/v1/trace` routes);
  the OpenTelemetry Collector's own `/v1/traces` aside.
"""

from __future__ import annotations

import re
from pathlib import Path

from fixtures.app_routes import api_routes

from tests.docs.doc_files import ROOT, documents

METRIC = re.compile(r"\bbatchpilot_[a-z0-9_]*[a-z0-9]\b")
SUFFIXES = re.compile(r"_(bucket|count|sum|total|created)$")


def undefined_metrics(docs: list[Path], source: str) -> list[str]:
    """file:line: name, for each metric name in `docs` that no literal in `source` spells."""
    literals = set(re.findall(r"""["']([a-z0-9_:]+)["']""", source))
    defined = {name.removeprefix("batchpilot_") for name in literals}
    missing = []
    for doc in docs:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for name in METRIC.findall(line):
                short = name.removeprefix("batchpilot_")
                if not ({short, SUFFIXES.sub("", short)} & defined
                        or any(d.startswith(short) for d in defined)):
                    missing.append(f"{doc.name}:{number}: {name}")
    return missing


def test_every_metric_the_docs_name_is_defined() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "control").rglob("*.py"))
    docs = documents()
    assert sum(len(METRIC.findall(d.read_text())) for d in docs) > 30
    missing = undefined_metrics(docs, source)
    assert not missing, "metrics the docs name that the code does not define:\n" + "\n".join(
        missing)


def test_the_metric_check_finds_a_renamed_metric(tmp_path: Path) -> None:
    doc = tmp_path / "metrics.md"
    doc.write_text("`batchpilot_kv_usage_ratio`, `batchpilot_queue_delay_seconds_bucket`\n"
                   "`batchpilot_time_to_first`, `batchpilot_kv_usage_percent`\n")
    source = '("kv_usage_ratio", "x")\n"batchpilot_queue_delay_seconds" "time_to_first_token_s"'
    assert undefined_metrics([doc], source) == ["metrics.md:2: batchpilot_kv_usage_percent"]


# where the docs name a path; a path parameter ({request_id}) and a trailing dot of prose
# are not part of it
PATH = re.compile(r"(?<![\w.])(/(?:v1|control|fleet)/[A-Za-z0-9_/{}.-]*[A-Za-z0-9_}]"
                  r"|/(?:healthz|readyz|health|metrics|version|tokenize|detokenize)\b)")
NOT_OURS = {"/v1/traces"}  # the OpenTelemetry Collector's OTLP/HTTP path


def served_paths() -> list[str]:
    """Every API route of `batchpilot serve` and of the fleet's ingress."""
    from control.api.app import create_app
    from control.fleet.ingress import FleetIngress, build_app
    from control.fleet.local import LocalHandle
    from control.fleet.router import RoutingPolicy
    from control.serve.settings import ServeSettings

    server = create_app(ServeSettings(model="tiny"))  # builds the engine only when started
    ingress = build_app(FleetIngress([LocalHandle(object())], RoutingPolicy()))
    return sorted({path for app in (server, ingress) for path, _ in api_routes(app.routes)
                   if not path.startswith("/{")})  # the ingress's catch-all relay


def unserved_paths(docs: list[Path], served: list[str]) -> list[str]:
    """file:line: path, for each path in `docs` no route serves nor prefixes."""
    routes = [re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", p) + "$") for p in served]
    missing = []
    for doc in docs:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for path in PATH.findall(line):
                if path in NOT_OURS or any(r.match(path) for r in routes):
                    continue
                if not any(s.startswith(path + "/") for s in served):
                    missing.append(f"{doc.name}:{number}: {path}")
    return missing


def test_every_path_the_docs_name_is_served() -> None:
    served = served_paths()
    assert "/control/fleet/autoscale" in served and "/v1/trace/requests/{request_id}" in served
    missing = unserved_paths(documents(), served)
    assert not missing, "paths the docs name that nothing serves:\n" + "\n".join(missing)


def test_the_path_check_finds_a_moved_route(tmp_path: Path) -> None:
    doc = tmp_path / "routes.md"
    doc.write_text("GET `/v1/trace/requests/cmpl-1` and `/v1/trace` (all of them), then\n"
                   "`/v1/trace/request/cmpl-1`; `POST /control/config`. `/healthz`.\n")
    served = ["/v1/trace/requests/{request_id}", "/v1/trace/slow", "/control/config",
              "/healthz"]
    assert unserved_paths([doc], served) == ["routes.md:2: /v1/trace/request/cmpl-1"]
