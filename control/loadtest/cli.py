"""`batchpilot loadtest`: replay a scenario against a server, optionally A/B between server
configs applied through the control API, and report what users feel.

    batchpilot loadtest --scenario playbooks/scenarios/mixed.yaml --url http://127.0.0.1:8000
    batchpilot loadtest --scenario mixed.yaml --compare continuous:batching=continuous \\
        --compare static:batching=static --rounds 2 --out results/

With --compare, each round applies every config in turn (PATCH /control/config), runs the
whole scenario against it, and moves on; the server's original config is restored at the
end (a rollback, audited like any change). Results: a side-by-side table on the terminal,
report.md and percentiles.png under --out, and the rows in DuckDB (--db FILE, else the
server's trace DB through POST /v1/loadtest/results when it has one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from control.cli.ctl import Client, build_patch
from control.cli.ctl_error import CtlError

DEFAULT_URL = "http://127.0.0.1:8000"


def add_loadtest_parser(sub: Any) -> None:
    p = sub.add_parser("loadtest", help="replay a traffic scenario against a server",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", required=True, metavar="YAML",
                   help="a scenario file (see playbooks/scenarios/)")
    p.add_argument("--url", default=os.environ.get("BATCHPILOT_URL", DEFAULT_URL),
                   help="the server (default $BATCHPILOT_URL or %(default)s)")
    p.add_argument("--compare", action="append", metavar="NAME:KEY=VALUE[,KEY=VALUE...]",
                   help="a server config to A/B (give two or more); KEYs as in"
                   " `batchpilot ctl set`")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --compare: rounds of alternation (default %(default)s)")
    p.add_argument("--requests", type=int, help="send only the first N planned requests")
    p.add_argument("--rate", type=float, help="override the scenario's arrival rate (req/s)")
    p.add_argument("--tokenizer", metavar="MODEL",
                   help="tokenizer for exact prompt lengths (default: the served model)")
    p.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    p.add_argument("--client-retries", type=_client_retries, default=0, metavar="N",
                   help="send a refused request (429, 503) again after its Retry-After, up"
                   " to N times, as the OpenAI SDK does (its default is 2); its latencies"
                   " count from the first send (default %(default)s: a refusal is final)")
    p.add_argument("--out", metavar="DIR", help="write report.md and percentiles.png here")
    p.add_argument("--db", metavar="FILE", help="save results to this DuckDB file")
    p.add_argument("--token-env", default="BATCHPILOT_TOKEN",
                   help="env var with the control API token (for --compare and saving)")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    p.set_defaults(func=main)


def _client_retries(text: str) -> int:
    from control.loadtest.retries import ClientRetries

    try:
        return ClientRetries(int(text)).retries
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc) if text.strip().lstrip("-").isdigit()
                                         else f"not a whole number: {text!r}") from None


def parse_compare(specs: list[str] | None) -> list[tuple[str, dict[str, Any] | None]]:
    if not specs:
        return [("current", None)]
    if len(specs) < 2:
        raise CtlError("--compare needs two or more configs", 2)
    configs = []
    for spec in specs:
        name, sep, rest = spec.partition(":")
        if not sep or not name.strip():
            raise CtlError(f"--compare {spec!r} must be NAME:KEY=VALUE[,KEY=VALUE...]", 2)
        assignments = [a.strip() for a in rest.split(",") if a.strip()]
        configs.append((name.strip(), build_patch(assignments) if assignments else {}))
    names = [n for n, _ in configs]
    if len(set(names)) != len(names):
        raise CtlError("--compare names must differ", 2)
    return configs


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except (CtlError, ValueError, FileNotFoundError) as exc:
        code = exc.code if isinstance(exc, CtlError) else 2
        print(f"batchpilot loadtest: error: {exc}", file=sys.stderr)
        return code


def _main(args: argparse.Namespace) -> int:
    from control.loadtest.scenario import load_scenario, plan, with_rate

    configs = parse_compare(args.compare)
    if args.rounds < 1:
        raise CtlError("--rounds must be >= 1", 2)
    scenario = load_scenario(args.scenario)
    if args.rate is not None:
        scenario = with_rate(scenario, args.rate)
    planned = plan(scenario)[: args.requests] if args.requests else plan(scenario)
    if not planned:
        raise CtlError("the scenario plans no request", 2)
    client = Client(args.url, args.token_env)
    model = _served_model(client)
    maker = _prompt_maker(args.tokenizer or model)
    original = client.call("GET", "/control/config")["version"] if args.compare else None
    runs: dict[str, list] = {name: [] for name, _ in configs}
    try:
        for round_no in range(args.rounds):
            for name, patch in configs:
                if patch is not None:
                    _apply(client, name, patch, scenario.name)
                label = f"{name} (round {round_no + 1}/{args.rounds})" if args.compare \
                    else scenario.name
                prompts = run_prompts(maker, planned, f"{scenario.seed}:{name}:{round_no}")
                runs[name].append(_run_one(args, client, planned, prompts, model, scenario,
                                           label))
    finally:
        if original is not None:
            client.call("POST", f"/control/rollback/{original}",
                        {"reason": f"loadtest {scenario.name}: restore the config"})
    return _report(args, client, scenario, configs, runs)


def _served_model(client: Client) -> str:
    models = client.call("GET", "/v1/models").get("data") or []
    if not models:
        raise CtlError(f"{client.url} serves no model", 1)
    return models[0]["id"]


def run_prompts(maker: Any, planned: list, run_key: str) -> dict[int, str]:
    """One run's prompt texts. Every run (config x round) has the same lengths and
    arrivals but its own texts: a server's prefix cache must not serve a later config
    from the prompts an earlier one already computed (it did: a measured 750-token
    prompt's TTFT fell from 5 s to 0.4 s in the second config of an A/B)."""
    return {p.index: maker.make(p.prompt_tokens, seed=f"{run_key}:{p.index}")[0]
            for p in planned}


def _prompt_maker(tokenizer_name: str) -> Any:
    from control.loadtest.prompts import PromptMaker, load_tokenizer

    try:
        return PromptMaker(load_tokenizer(tokenizer_name))
    except Exception as exc:
        raise CtlError(f"cannot load the tokenizer of {tokenizer_name!r} ({exc}); name one"
                       " with --tokenizer", 2) from None


def _apply(client: Client, name: str, patch: dict[str, Any], scenario: str) -> None:
    version = client.call("GET", "/control/config")["version"]
    client.call("PATCH", "/control/config", {"changes": patch, "reason":
                f"loadtest {scenario}: config {name}"}, if_match=version)


def _run_one(args, client: Client, planned, prompts, model: str, scenario, label: str):
    from tqdm import tqdm

    from control.loadtest.retries import ClientRetries
    from control.loadtest.runner import run

    token = os.environ.get(args.token_env) or None
    cpu_start, wall_start = time.process_time(), time.monotonic()
    with tqdm(total=len(planned), desc=label, unit="req", file=sys.stderr) as bar:
        results, duration = asyncio.run(run(
            args.url, planned, prompts, model=model, concurrency=scenario.concurrency,
            timeout_s=args.timeout, token=token, on_done=lambda _r: bar.update(),
            retries=ClientRetries(args.client_retries)))
    cost = (time.process_time() - cpu_start, time.monotonic() - wall_start)
    return results, duration, cost


def _report(args, client: Client, scenario, configs, runs) -> int:
    from control.loadtest.client_cost import ClientCost, cost_notes, usable_cores
    from control.loadtest.metrics import summarize
    from control.loadtest.report import markdown_report, plot_percentiles, text_table

    summaries, saved = [], []
    for name, _ in configs:
        results = [r for res, _, _ in runs[name] for r in res]
        duration = sum(d for _, d, _ in runs[name])
        summary = summarize(results, duration, scenario.slo, label=name)
        summaries.append(summary)
        saved.append((name, summary, results))
    if args.json:
        from dataclasses import asdict

        print(json.dumps([asdict(s) for s in summaries], indent=2, default=str))
    else:
        print(text_table(summaries))
    notes = [f"scenario file: {args.scenario}", f"server: {args.url}",
             f"requests per run: {len(runs[configs[0][0]][0][0])}, rounds: {args.rounds}",
             f"client: a refused request sent again up to {args.client_retries} times after"
             " its Retry-After (the OpenAI SDK's rule), its latencies counted from the first"
             " send" if args.client_retries else "client: a refusal is final (no resends)"]
    if args.rate is not None:  # the description above states the scenario's own rate
        notes.append(f"arrival rate: {args.rate:g} requests/s on average (--rate), in place"
                     " of the scenario's own")
    if args.requests:
        notes.append(f"only the first {args.requests} planned requests (--requests)")
    cost = ClientCost(sum(c for name in runs for _, _, (c, _) in runs[name]),
                      sum(w for name in runs for _, _, (_, w) in runs[name]), usable_cores())
    cost_note, warning = cost_notes(cost, args.url)
    notes.append(cost_note)
    print(cost_note, file=sys.stderr)
    if warning:
        notes.append(f"warning: {warning}")
        print(f"batchpilot loadtest: warning: {warning}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(markdown_report(scenario.name, scenario.description,
                                                       summaries, notes))
        plot_percentiles(summaries, out / "percentiles.png")
        print(f"report: {out / 'report.md'}, plot: {out / 'percentiles.png'}", file=sys.stderr)
    _store(args, client, scenario, saved)
    return 0


def _store(args, client: Client, scenario, saved) -> None:
    from control.loadtest import store
    from control.loadtest.results_body import bodies_for_api

    run_id = time.strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]
    if args.db:
        for label, summary, results in saved:
            store.save_to_file(args.db, run_id, scenario.name, label, args.url, summary,
                               results)
        print(f"results saved to {args.db} (run {run_id})", file=sys.stderr)
        return
    rows = [store.rows_for_api(run_id, scenario.name, label, args.url, summary, results)
            for label, summary, results in saved]
    bodies = bodies_for_api(rows)
    try:
        for body in bodies:
            client.call("POST", "/v1/loadtest/results", body)
        print(f"results saved in the server's trace DB (run {run_id})", file=sys.stderr)
    except CtlError as exc:
        print(f"results not saved ({exc}); pass --db FILE to keep them", file=sys.stderr)
