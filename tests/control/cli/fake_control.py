"""A stand-in for the control API that `batchpilot ctl` talks to: canned answers per
(method, path), and every request the CLI sent recorded for the tests to read."""

from __future__ import annotations

import json
import urllib.parse
from http.server import ThreadingHTTPServer
from typing import Any

from fixtures.http_stub import QuietHandler, reply

LANES = {"interactive": {"weight": 4.0, "max_running": None, "max_waiting": None,
                         "policy": "priority", "tenant_fair_share": False,
                         "queue_timeout_ms": None, "preempt_first": False, "batching": None,
                         "preempt_to_start": True, "slo": {"ttft_s": 1.0, "tpot_s": 0.1}},
         "batch": {"weight": 1.0, "max_running": 8, "max_waiting": None, "policy": "fcfs",
                   "tenant_fair_share": True, "queue_timeout_ms": 60000,
                   "preempt_first": True, "batching": "static", "preempt_to_start": False,
                   "slo": None}}
CONFIG = {"version": 7, "admission": "open",
          "config": {"max_num_seqs": 128, "kv_cache_high_watermark": 0.88,
                     "schedule_policy": "decode_first", "long_context_lane": None,
                     "tenant_lanes": {"acme": "batch"}, "lanes": LANES,
                     "default_slo": {"ttft_s": 10.0, "tpot_s": None}},
          "static": {"block_size": 16, "num_kv_blocks": 4096},
          "profiles": {"degrade": {"max_num_seqs": 32}, "night": {"batching": "static"}},
          "lanes_state": {"interactive": {"running": 3, "waiting": 1},
                          "batch": {"running": 0, "waiting": 12}}}
PATCHED = {"applied": True, "version": 8, "diff": {"max_num_seqs": [128, 64],
                                                   "lanes.batch.batching": ["static", None]},
           "config": CONFIG["config"]}
T0 = 1_700_000_000.0
HISTORY = {"versions": [
    {"version": 1, "time": T0, "actor": "server", "source": "startup", "reason": "",
     "diff": {}},
    {"version": 2, "time": T0 + 60, "actor": "alice", "source": "api", "reason": "incident 42",
     "diff": {"max_num_seqs": [128, 64], "a": [1, 2], "b": [1, 2], "c": [1, 2]}}]}


def refusal(message: str, code: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": code}, **extra}


class FakeControl:
    """The control API on 127.0.0.1:<free port>: `answers[(method, path)] = (status, JSON
    or bytes)`; every request lands in `seen` as (method, path, query, headers, body)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {
            ("GET", "/control/config"): (200, CONFIG)}
        self.seen: list[tuple[str, str, str, dict[str, str], Any]] = []
        fake = self

        class Handler(QuietHandler):
            def answer(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urllib.parse.urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.seen.append((self.command, url.path, url.query, headers,
                                  json.loads(raw) if raw else None))
                status, body = fake.answers.get((self.command, url.path),
                                                (404, refusal("no such route")))
                reply(self, status, body)

            do_GET = do_POST = do_PATCH = answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
