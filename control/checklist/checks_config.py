"""Checks on the configuration: limits, watermarks, chunked prefill, the token budget
against the KV pool, and the lanes that isolate interactive traffic. Field names are the
live config's (engine/config/schema.py): the seed's max_active_sequences is max_num_seqs, its
max_batched_tokens max_num_batched_tokens."""

from __future__ import annotations

from typing import Any

from control.checklist.evidence import Evidence
from control.checklist.registry import config_missing, fmt, lookup, register
from control.checklist.result import Verdict, failed, passed
from engine.config.slo import LaneSLO

GLOBAL_LIMITS = ("max_num_seqs", "max_num_batched_tokens", "max_waiting_requests",
                 "queue_timeout_ms")


@register("limits_set", min={"max_num_seqs": 1, "max_num_batched_tokens": 1,
                             "max_waiting_requests": 1, "queue_timeout_ms": 1},
          lane_limits={"batch": ["max_running"]})
def limits_set(ev: Evidence, p: dict[str, Any]) -> Verdict:
    lanes = (ev.config or {}).get("lanes") or {}
    lane_keys = [f"lanes.{lane}.{key}" for lane, keys in p["lane_limits"].items()
                 if lane in lanes for key in keys]
    values, missing = lookup(ev, *GLOBAL_LIMITS, *lane_keys)
    if missing:
        return config_missing(ev, missing)
    problems = []
    for key in GLOBAL_LIMITS:
        low = p["min"].get(key, 1)
        if values[key] is None or values[key] < low:
            problems.append(f"{key} {fmt(values[key])} < {low}")
    seqs = values["max_num_seqs"]
    for key in lane_keys:
        if values[key] is None:
            problems.append(f"{key} unset: the lane may take all {seqs} sequences"
                            if key.endswith("max_running") else f"{key} unset")
        elif key.endswith("max_running") and values[key] > seqs:
            problems.append(f"{key} {values[key]} > max_num_seqs {seqs}: no limit")
    absent = [lane for lane in p["lane_limits"] if lane not in lanes]
    shown = ", ".join(f"{k} {fmt(v)}" for k, v in values.items())
    if absent:
        shown += f"; lane(s) {', '.join(absent)} not configured"
    if problems:
        return failed("; ".join(problems) + f" ({shown})", problems=problems, values=values)
    return passed(shown, values=values)


@register("watermarks_ordered", min_gap=0.02)
def watermarks_ordered(ev: Evidence, p: dict[str, Any]) -> Verdict:
    keys = ("kv_cache_high_watermark", "kv_cache_reject_watermark")
    values, missing = lookup(ev, *keys)
    if missing:
        return config_missing(ev, missing)
    high, reject = values[keys[0]], values[keys[1]]
    shown = f"kv_cache_high_watermark {fmt(high)}, kv_cache_reject_watermark {fmt(reject)}"
    if high is None or reject is None:
        return failed(f"{shown}: both watermarks must be set", values=values)
    if not 0.0 < high < reject <= 1.0:
        return failed(f"{shown}: must be 0 < high < reject <= 1 (new prefills stop at the"
                      " high one before requests are rejected at the reject one)",
                      values=values)
    if reject - high < p["min_gap"]:
        return failed(f"{shown}: only {reject - high:.3f} apart (< {p['min_gap']}): prefills"
                      " stop and rejections start almost together", values=values)
    return passed(f"{shown} (0 < high < reject <= 1)", values=values)


@register("chunked_prefill_decided")
def chunked_prefill_decided(ev: Evidence, p: dict[str, Any]) -> Verdict:
    values, missing = lookup(ev, "chunked_prefill", "prefill_chunk_size",
                             "max_num_batched_tokens")
    if missing:
        return config_missing(ev, missing)
    chunk, budget = values["prefill_chunk_size"], values["max_num_batched_tokens"]
    if values["chunked_prefill"]:
        shown = f"chunked_prefill on, prefill_chunk_size {chunk}, max_num_batched_tokens {budget}"
        if chunk > budget:
            return failed(f"prefill_chunk_size {chunk} > max_num_batched_tokens {budget}: a"
                          f" chunk never fits one step's budget ({shown})", values=values)
        return passed(f"{shown}: a chunk fits one step", values=values)
    more, missing = lookup(ev, "static.max_model_len")
    if missing:
        return config_missing(ev, missing)
    longest = more["static.max_model_len"]
    shown = f"chunked_prefill off, max_num_batched_tokens {budget}, max_model_len {longest}"
    if budget < longest:
        return failed(f"{shown}: max_num_batched_tokens {budget} < max_model_len {longest},"
                      " so a long prompt can never run whole", values={**values, **more})
    return passed(f"{shown}: a whole prompt fits one step (decodes wait behind it)",
                  values={**values, **more})


@register("kv_pool_fits_budget", max_budget_share=1.0)
def kv_pool_fits_budget(ev: Evidence, p: dict[str, Any]) -> Verdict:
    values, missing = lookup(ev, "max_num_batched_tokens", "max_num_seqs",
                             "static.num_kv_blocks", "static.block_size")
    if missing:
        return config_missing(ev, missing)
    budget, seqs = values["max_num_batched_tokens"], values["max_num_seqs"]
    blocks, block_size = values["static.num_kv_blocks"], values["static.block_size"]
    pool = blocks * block_size
    shown = (f"max_num_batched_tokens {budget}, max_num_seqs {seqs}; KV pool {blocks} blocks"
             f" x {block_size} tokens = {pool} tokens")
    limit = pool * p["max_budget_share"]
    if budget > limit:
        share = "" if p["max_budget_share"] == 1 else f"{p['max_budget_share']:g} x "
        return failed(f"max_num_batched_tokens {budget} > {fmt(limit)} tokens ({share}the KV"
                      f" pool): {shown}", values=values)
    if seqs > blocks:
        return failed(f"max_num_seqs {seqs} > num_kv_blocks {blocks}: each sequence needs a"
                      f" block ({shown})", values=values)
    return passed(f"{shown} ({budget / pool:.0%} of the pool per step)", values=values)


@register("lanes_isolated", interactive_lane="interactive", min_weight_ratio=1.0,
          tenants=[])
def lanes_isolated(ev: Evidence, p: dict[str, Any]) -> Verdict:
    values, missing = lookup(ev, "lanes")
    if missing:
        return config_missing(ev, missing)
    lanes, name = values["lanes"], p["interactive_lane"]
    if name not in lanes:
        return failed(f"no lane {name!r} (lanes: {', '.join(lanes) or 'none'}): chat shares"
                      " a queue with batch work", lanes=list(lanes))
    weights, missing = lookup(ev, *(f"lanes.{lane}.weight" for lane in lanes))
    if missing:
        return config_missing(ev, missing)
    own = weights[f"lanes.{name}.weight"]
    others = {k.split(".")[1]: w for k, w in weights.items() if k != f"lanes.{name}.weight"}
    shown = "weights " + ", ".join(f"{k.split('.')[1]} {fmt(w)}" for k, w in weights.items())
    heaviest = max(others.items(), key=lambda kv: kv[1], default=None)
    if heaviest is not None and own < p["min_weight_ratio"] * heaviest[1]:
        return failed(f"lanes.{name}.weight {fmt(own)} < {p['min_weight_ratio']:g} x"
                      f" lanes.{heaviest[0]}.weight {fmt(heaviest[1])} ({shown})",
                      weights=weights)
    routed = ""
    if p["tenants"]:
        found, missing = lookup(ev, "tenant_lanes")
        if missing:
            return config_missing(ev, missing)
        table = found["tenant_lanes"] or {}
        unrouted = [t for t in p["tenants"] if t not in table]
        if unrouted:
            return failed(f"tenant(s) {', '.join(unrouted)} not routed: tenant_lanes is"
                          f" {table or '{}'}", tenant_lanes=table, unrouted=unrouted)
        routed = "; tenants " + ", ".join(f"{t} -> {table[t]}" for t in p["tenants"])
    return passed(f"lane {name!r} exists; {shown}{routed}", weights=weights)



@register("slo_set", lanes=["interactive"], step_policy="goodput")
def slo_set(ev: Evidence, p: dict[str, Any]) -> Verdict:
    """The named lanes have a TTFT and a TPOT target (their own or default_slo's), and the
    scheduler sizes steps for them (step_policy): goodput is counted against these."""
    values, missing = lookup(ev, "lanes", "default_slo", "step_policy")
    if missing:
        return config_missing(ev, missing)
    lanes, default = values["lanes"], values["default_slo"] or {}
    slos = {name: (settings or {}).get("slo") or default for name, settings in lanes.items()}
    shown = "; ".join(f"{name} {_slo_text(slo)}" for name, slo in slos.items())
    problems = [f"no lane {name!r}" for name in p["lanes"] if name not in lanes]
    problems += [f"lanes.{name}.slo has no {key}" for name in p["lanes"] if name in slos
                 for key in ("ttft_s", "tpot_s") if slos[name].get(key) is None]
    if p["step_policy"] and values["step_policy"] != p["step_policy"]:
        problems.append(f"step_policy {values['step_policy']} (not {p['step_policy']}):"
                        " steps are not sized for the SLOs")
    if problems:
        return failed("; ".join(problems) + f" ({shown})", problems=problems, slos=slos)
    return passed(f"{shown}; step_policy {values['step_policy']}", slos=slos)


def _slo_text(slo: dict[str, Any]) -> str:
    return LaneSLO.parse(slo, "slo").describe()
