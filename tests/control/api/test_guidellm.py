"""GuideLLM, vLLM's load tester (the real `guidellm run` CLI), against `batchpilot serve`.

GuideLLM runs a few seconds of concurrent streaming chat requests at a server on the tiny
random model; every request must complete, and GuideLLM's own figures per request must
agree with the server's trace (`--trace-db`), matched by the response id GuideLLM records
(the server's `chatcmpl-...` id, the trace's `request_id`):

- output and prompt tokens exactly (GuideLLM reads them from the stream's usage chunk);
- TTFT: the server's (arrival -> first token) lies inside the client's (request sent ->
  first text chunk): it starts no earlier and ends no later, up to CLOCK_SLACK_S, and the
  client's is longer by at most TTFT_GAP_S (socket, SSE framing and GuideLLM's own event
  loop on a shared 2-core machine).

GuideLLM 0.8 needs more flags than target and model (guidellm_command): `--profile` and
`--data` are required fields of its run (without them it exits 2 naming them), and a
constraint ends the run (else it runs until interrupted). The constraint is a request
count, not `max_duration`: at a deadline GuideLLM cancels the requests in flight (its
"incomplete"), and this test wants every request to complete. Its tokenizer comes from
the model id, a local path or hub id (a bare name is looked up on the hub: offline, an
OSError), as against vLLM, whose model id is the path it serves: so the server serves the
checkpoint under its path (`--served-model-name`), and GuideLLM needs no `--tokenizer`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from fixtures.serving import ServerProcess

CONFIG = {"serving": {"num_kv_blocks": 256, "max_active_sequences": 16}}
NUM_REQUESTS, STREAMS = 24, 2
PROMPT_TOKENS, OUTPUT_TOKENS = 32, 16
CLOCK_SLACK_S = 0.002  # both sides stamp time.time() on this host; rounding only
TTFT_GAP_S = 0.5  # client TTFT - server TTFT, per request (a shared 2-core machine)
MEDIAN_TTFT_GAP_S = 0.1  # seen: 15-17 ms


def guidellm_command(target: str, model: str) -> list[str]:
    """`guidellm run`: target and model, plus the flags GuideLLM 0.8 cannot run without
    (a profile and a data spec are required) and one that ends the run."""
    if importlib.util.find_spec("guidellm") is None:
        pytest.fail("guidellm is not installed: it is a declared test dependency (the `test`"
                    " extra in pyproject.toml); run `make install` or"
                    " `.venv/bin/pip install -e '.[test]'`")
    return [sys.executable, "-m", "guidellm", "run",
            "--backend", f"kind=openai_http,target={target},model={model}",
            "--profile", f"kind=concurrent,streams={STREAMS}",
            "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},"
                      f"output_tokens={OUTPUT_TOKENS}",
            "--constraint", f"kind=max_requests,count={NUM_REQUESTS}",
            "--disable-progress"]  # a progress bar redrawn into a pipe is noise in the log


def run_guidellm(target: str, model: str, cwd: Path) -> dict[str, Any]:
    """GuideLLM's report (benchmarks.json, written in `cwd` by default)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run(guidellm_command(target, model), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=150)
    log = done.stdout + done.stderr
    (cwd / "guidellm.out").write_text(log)
    assert done.returncode == 0, f"guidellm exited {done.returncode}:\n{log[-6000:]}"
    report = cwd / "benchmarks.json"
    assert report.exists(), f"guidellm wrote no benchmarks.json:\n{log[-6000:]}"
    print(f"guidellm ran {time.monotonic() - started:.1f} s")
    return json.loads(report.read_text())


def trace_requests(db: Path) -> dict[str, dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT request_id, outcome, finish_reason, num_prompt_tokens,"
                          " num_output_tokens, arrival_time, first_token_time, ttft_s"
                          " FROM requests")
        names = [d[0] for d in cur.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}
    finally:
        con.close()


def text_late(output: str) -> bool:
    """GuideLLM's TTFT is the first chunk with text, the server's the first token. They
    differ when the first tokens show no text yet: the random model's output may begin with
    bytes of an unfinished character (shown as U+FFFD once a later token or the end settles
    them) or be only skipped special tokens (no text at all, no TTFT in GuideLLM)."""
    return output.startswith("\ufffd")


def test_guidellm_runs_and_agrees_with_the_trace(tiny_llama_dir, tmp_path):
    db = tmp_path / "trace.duckdb"
    model = str(tiny_llama_dir)  # the model id is the checkpoint's path, as vLLM's
    with ServerProcess(tiny_llama_dir, tmp_path, CONFIG, "--served-model-name", model,
                       "--trace-db", str(db)) as server:
        report = run_guidellm(server.url, model, tmp_path)
        server.terminate()  # drains; the trace is complete once the process exits
        assert server.wait(60) == 0, server.log()[-4000:]
    [benchmark] = report["benchmarks"]
    requests = benchmark["requests"]
    assert requests["errored"] == [] and requests["incomplete"] == [], (
        [r["info"].get("error") for r in requests["errored"] + requests["incomplete"]])
    client = {r["response_id"]: r for r in requests["successful"]}
    assert len(client) == len(requests["successful"]) >= NUM_REQUESTS, len(client)

    server_rows = trace_requests(db)
    assert set(server_rows) == set(client), "GuideLLM's requests are the trace's requests"
    gaps = []
    for rid, seen in client.items():
        row = server_rows[rid]
        assert (row["outcome"], row["finish_reason"]) == ("finished", "length"), row
        assert seen["output_tokens"] == row["num_output_tokens"] == OUTPUT_TOKENS, (seen, row)
        assert seen["prompt_tokens"] == row["num_prompt_tokens"], (seen, row)
        timings = seen["info"]["timings"]
        assert row["arrival_time"] >= timings["request_start"] - CLOCK_SLACK_S, (rid, row)
        if seen["time_to_first_token_ms"] is None:  # no chunk carried text: see text_late
            assert seen["output"] == "", seen
            continue
        client_ttft_s = seen["time_to_first_token_ms"] / 1e3
        assert client_ttft_s == pytest.approx(
            timings["first_token_iteration"] - timings["request_start"], abs=1e-6)
        assert row["first_token_time"] <= timings["first_token_iteration"] + CLOCK_SLACK_S
        if text_late(seen["output"]):
            continue
        gap = client_ttft_s - row["ttft_s"]
        assert -CLOCK_SLACK_S <= gap <= TTFT_GAP_S, (rid, client_ttft_s, row["ttft_s"])
        gaps.append(gap)
    assert len(gaps) >= len(client) // 2, "most outputs show text from their first token"
    print(f"TTFT gap client - server: median {statistics.median(gaps) * 1e3:.1f} ms,"
          f" max {max(gaps) * 1e3:.1f} ms over {len(gaps)} requests")
    assert statistics.median(gaps) <= MEDIAN_TTFT_GAP_S, gaps
    check_summary(benchmark["metrics"], server_rows)


def check_summary(metrics: dict[str, Any], server_rows: dict[str, dict[str, Any]]) -> None:
    """GuideLLM's aggregate figures (its console table) against the trace's sums."""
    n = len(server_rows)
    assert metrics["request_totals"] == {"successful": n, "errored": 0, "incomplete": 0,
                                         "total": n}
    for name, column in (("output_token_count", "num_output_tokens"),
                         ("prompt_token_count", "num_prompt_tokens")):
        stats = metrics[name]["successful"]
        assert stats["count"] == n
        assert stats["total_sum"] == sum(row[column] for row in server_rows.values()), name
