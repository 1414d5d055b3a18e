"""Shared by the Grafana tests: the files under grafana/, the PromQL of the boards, and a
real Prometheus (the Debian `prometheus` binary) run for a test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

GRAFANA = Path(__file__).resolve().parents[2] / "grafana"
BOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DS_UID = "batchpilot-prom"


def binary(name: str) -> str:
    """promtool or prometheus; `make test` installs them (system-deps), so a missing one
    is a broken set-up, not a skip."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: make system-deps (Debian package prometheus)")
    return path


def board_queries(board: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, annotation and template variable."""
    out = [(f"panel {p['title']!r}", t.get("expr", "")) for p in board["panels"]
           if p["type"] != "row" for t in p.get("targets", [])]
    out += [(f"annotation {a['name']!r}", a["expr"]) for a in board["annotations"]["list"]]
    out += [(f"variable {v['name']!r}", v["query"]) for v in board["templating"]["list"]]
    return out


# Grafana's variables as "All" selects them, and its intervals at a 1 s scrape interval
SUBSTITUTE = {"$model": ".*", "$lane": ".*", "$tenant": ".*", "$__rate_interval": "30s",
              "$__interval": "30s"}


def promql(expr: str) -> str:
    for name in sorted(SUBSTITUTE, key=len, reverse=True):  # $__rate_interval first
        expr = expr.replace(name, SUBSTITUTE[name])
    return expr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """`prometheus` on 127.0.0.1:<free port> scraping `target` every second, with the
    repository's alert rules evaluated every second."""

    def __init__(self, target: str, tmp: Path):
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(GRAFANA / "alerts.yml")],
            "scrape_configs": [{"job_name": "batchpilot",
                                "static_configs": [{"targets": [target]}]}]}))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = tmp / "prometheus.log"
        self.cmd = [binary("prometheus"), f"--config.file={config}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address={self.url.removeprefix('http://')}",
                    "--log.level=warn"]
        self.proc: subprocess.Popen | None = None
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def __enter__(self) -> Prometheus:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            self.until(self._ready, "prometheus never got ready")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            return self.http.get("/-/ready").status_code == 200
        except httpx.TransportError:
            return False

    def query(self, expr: str) -> list[dict]:
        body = self.http.get("/api/v1/query", params={"query": expr}).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def until(self, predicate, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, what
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.http.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
