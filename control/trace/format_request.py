"""Text for `batchpilot trace request ID`: one request's timeline (control/trace/queries.py
request_timeline, from a file, a server or a fleet's ingress) as an operator reads it.
"""

from __future__ import annotations

from typing import Any

from control.trace.format import clock, dur, spans, table

# a wait's admissions row is written when the wait ends, at that time
EVENT_NAMES = {"queued": "queue wait ended", "requeued": "requeue wait ended"}
# a fleet ingress's routing reasons (control/fleet/router.py Decision, ingress.forward)
ROUTING_WORDS = {
    "precise": "its KV index said this replica held the prompt's leading blocks, cheapest"
               " with its load counted (precise)",
    "affinity": "the prompt's hashed replica (affinity)",
    "balance": "the less loaded of two (balance: the preferred one was too loaded)",
    "random": "at random (random routing)", "only": "the only healthy replica",
    "retry": "the replica first chosen did not accept it (retry)"}


def request(tl: dict[str, Any]) -> str:
    rec, events = tl["request"], tl["events"]
    start = rec["arrival_time"] if rec else events[0]["time"]
    lines = _request_header(tl) + _breakdown(tl["breakdown"])
    waited = {(a["time"], a["kind"]): a for a in tl["admissions"]}
    rows = []
    for e in events:
        detail = e["detail"] or ""
        wait = waited.get((e["time"], e["event"]))
        if wait and wait["wait_s"] is not None:
            detail = f"{dur(wait['wait_s'])}: {_reasons(wait['wait_reasons'])}"
        elif wait and wait["message"]:
            detail = f"{detail}: {wait['message']}"
        rows.append([f"+{dur(e['time'] - start)}", clock(e["time"]),
                     EVENT_NAMES.get(e["event"], e["event"]), detail])
    lines += ["", f"events (from arrival at {clock(start, True)})"] + table(
        [">since arrival", "time", "event", "detail"], rows)
    return "\n".join(lines + ["", "steps it ran in"] + _step_account(tl["steps"]))


def _request_header(tl: dict[str, Any]) -> list[str]:
    rec = tl["request"]
    if rec is None:
        first = tl["admissions"][0]
        return [f"request {tl['request_id']}: no final record (still in flight, or its record"
                " was dropped)", f"  lane {first['lane']}, tenant {first['tenant']},"
                f" priority {first['priority']}"]
    why = [w for w in (rec["finish_reason"], rec["finish_detail"]) if w and w != rec["outcome"]]
    trace = []
    if rec.get("trace_id"):
        others = [r for r in tl.get("trace_requests") or () if r != rec["request_id"]]
        trace = [f"  trace {rec['trace_id']}" + (f" (also: {', '.join(others)})"
                                                  if others else "")]
    resent = ["  resent: its client sent it again after a refusal (X-Stainless-Retry-Count),"
              " so it was admitted behind the requests on time"] if rec.get("resent") else []
    return [
        f"request {rec['request_id']}  (run {rec['run_id']}, model {rec['model']})",
        *trace, *_routed(rec, tl.get("replica")), *resent,
        f"  lane {rec['lane']}, tenant {rec['tenant']}, priority {rec['priority']}",
        f"  outcome {rec['outcome']}" + (f" ({', '.join(why)})" if why else ""),
        f"  tokens: prompt {rec['num_prompt_tokens']}, output {rec['num_output_tokens']},"
        f" cached {rec['num_cached_tokens']}; preemptions {rec['num_preemptions']}",
        f"  ttft {dur(rec['ttft_s'])}, tpot {dur(rec['tpot_s'])}, e2e {dur(rec['e2e_s'])}"]


def _routed(rec: dict[str, Any], replica: str | None) -> list[str]:
    said = routing_sentence(rec, replica)
    return [f"  {said}"] if said else []


def routing_sentence(rec: dict[str, Any], replica: str | None) -> str | None:
    """A fleet replica's row: why the ingress sent the request there (schema 5), None on
    a single server's. `replica`: the replica's name when the fleet answered."""
    reason = rec.get("routing_reason")
    if not reason:
        return None
    where = f" to replica {replica}" if replica else ""
    blocks = rec.get("routing_matched_blocks")
    held = "" if blocks is None else (
        f"; it held {blocks} leading block{'s' * (blocks != 1)} of the prompt")
    return f"routed{where} by the fleet ingress: {ROUTING_WORDS.get(reason, reason)}{held}"


def _breakdown(b: dict[str, Any] | None) -> list[str]:
    """Queue, prefill and decode add up to e2e; preempted is inside prefill and decode;
    the waits by reason add up to queue + preempted."""
    if b is None or not b["wait_reasons"] and all(
            b[k] is None for k in ("queue_s", "prefill_s", "decode_s")):  # e.g. rejected
        return []
    e2e = b["e2e_s"] or 0.0

    def share(s: float | None) -> str:
        return f"{s / e2e * 100:.0f}%" if s is not None and e2e > 0 else ""
    rows = [[name, dur(b[k]), share(b[k]), ""] for name, k in (
        ("queue", "queue_s"), ("prefill", "prefill_s"), ("decode", "decode_s"))]
    rows.append(["preempted", dur(b["preempted_s"]), "", "re-queued after a preemption,"
                 " inside prefill/decode"])
    rows += [[f"wait: {reason}", dur(s), "", ""] for reason, s in sorted(
        (b["wait_reasons"] or {}).items(), key=lambda kv: -kv[1])]
    return ["", f"where the time went (e2e {dur(b['e2e_s'])}; the waits by reason cover"
            " queue and preempted)"] + table(["", ">seconds", ">share", ""], rows)


def _reasons(reasons: dict[str, float] | None) -> str:
    return ", ".join(f"{k} {dur(v)}" for k, v in sorted(
        (reasons or {}).items(), key=lambda kv: -kv[1])) or "no step saw it"


def _step_account(ran: list[dict[str, Any]]) -> list[str]:
    """e.g. 'prefill: 2 steps, 96 tokens (steps 3-4)'; 'decode: 29 steps (5-33)'."""
    if not ran:
        return ["  none"]
    lines = []
    for phase in ("prefill", "decode"):
        mine = [s for s in ran if s["phase"] == phase and s["tokens"] is not None]
        if mine:
            tokens = f", {sum(s['tokens'] for s in mine)} tokens" if phase == "prefill" else ""
            lines.append(f"  {phase}: {len(mine)} steps{tokens} (steps"
                         f" {spans([s['step_id'] for s in mine])})")
    lines += [f"  preempted in step {s['step_id']} at {clock(s['start_time'])}"
              for s in ran if s["preempted_here"]]
    return lines
