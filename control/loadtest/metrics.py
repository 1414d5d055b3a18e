"""Load-test metrics as `vllm bench serve` defines them, from the runner's RequestResults.

Per request, in seconds from the moment it was sent:
  TTFT  first content chunk (streaming requests)
  TPOT  (E2E - TTFT) / (output_tokens - 1), streaming requests with more than one token
  ITL   every gap between consecutive content chunks (streaming requests)
  E2E   last byte
  TTFT gap  client TTFT - the server's ttft_s (streaming requests with a content chunk)
  E2E gap   client E2E - the server's e2e_s
A gap is the delay the server does not report (before its arrival stamp, on the way back):
positive when the server under-reports; counted only where both sides are known.
Distributions cover the successful (`ok`) requests; percentiles interpolate linearly
between samples, like numpy.percentile's default. A non-streaming request has no
first-token time (its ttft_s is the whole response) so it adds to E2E only; goodput still
checks its ttft_s against the TTFT SLO: that is when its user sees the first token.
Throughputs divide by the run's wall time, groups (by lane, by tenant) included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from control.loadtest.records import SLO, RequestResult

OUTCOMES = ("ok", "rejected", "timeout", "cancelled", "error")
PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e")
GAPS = ("ttft_gap", "e2e_gap")  # client - server, seconds
AUTO_LANE = "auto"  # by_lane key of requests sent without a lane (the server routes them)


@dataclass(frozen=True)
class Dist:
    """One latency over the successful requests, seconds; None: no sample."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


@dataclass
class Summary:
    """One load-test run of one config; JSON-able with dataclasses.asdict."""

    label: str  # the config's name
    duration_s: float  # wall time of the run: first send to last completion
    requests: int  # planned and sent
    ok: int
    outcomes: dict[str, int]  # every OUTCOMES key, then any other outcome seen
    rejected_rate: float  # shares of `requests`
    timeout_rate: float
    cancelled_rate: float
    error_rate: float
    prompt_tokens: int  # of ok requests (server usage, else the planned length)
    output_tokens: int  # of ok requests
    request_rps: float  # ok requests / duration_s
    output_tps: float  # output tokens of ok requests / duration_s
    total_tps: float  # prompt + output tokens of ok requests / duration_s
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2e: Dist
    ttft_gap: Dist  # client TTFT - server ttft_s
    e2e_gap: Dist  # client E2E - server e2e_s
    # the SLO checked, as a dict; {"by_lane": {lane: SLO dict}} when the scenario gave none
    # and the server sent its lanes' (batchpilot.slo); None: neither
    slo: dict | None
    goodput_rps: float | None  # ok requests meeting every SLO / duration_s; None: no SLO
    slo_met_share: float | None  # of ok requests; None: no SLO or no ok request
    by_lane: dict[str, Summary] = field(default_factory=dict)  # lane None as AUTO_LANE
    by_tenant: dict[str, Summary] = field(default_factory=dict)
    # by the lane the server ran each request in (batchpilot.lane; the planned lane or the
    # server's choice), requests it never ran left out; each group's slo and goodput are
    # its lane's own targets as the server reported them (batchpilot.slo), whatever SLO the
    # scenario gave: what the go-live checklist judges each lane by
    by_server_lane: dict[str, Summary] = field(default_factory=dict)
    # sent again after a refusal (--client-retries), and of those, ended ok
    resent: int = 0
    resent_ok: int = 0
    # ok requests meeting every SLO (None: no SLO): side by side at one offered load, the
    # count to compare; goodput_rps divides it by each side's own duration, which grows
    # when a side serves late requests at the end
    slo_met: int | None = None


def tpot_s(r: RequestResult) -> float | None:
    """(E2E - TTFT) / (output_tokens - 1); None unless streamed with more than one token."""
    if not r.planned.stream or r.output_tokens <= 1 or r.ttft_s is None or r.e2e_s is None:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def itls_s(r: RequestResult) -> list[float]:
    """Gaps between consecutive content chunks, seconds; empty when not streamed."""
    if not r.planned.stream:
        return []
    t = r.chunk_times_s
    return [b - a for a, b in zip(t, t[1:], strict=False)]


def ttft_gap_s(r: RequestResult) -> float | None:
    """Client TTFT - the server's, seconds (the server's counts from the last send, the
    client's from the first: the wait between sends is taken out); None unless the client
    timed a first content chunk (a non-streamed ttft_s, or a stream's without text, is the
    server's own)."""
    if not r.planned.stream or not r.chunk_times_s or r.ttft_s is None \
            or r.server_ttft_s is None:
        return None
    return r.ttft_s - r.last_send_s - r.server_ttft_s


def e2e_gap_s(r: RequestResult) -> float | None:
    """Client E2E - the server's (the wait between sends taken out, as for TTFT),
    seconds; None unless both are known."""
    if r.e2e_s is None or r.server_e2e_s is None:
        return None
    return r.e2e_s - r.last_send_s - r.server_e2e_s


def meets_slo(r: RequestResult, slo: SLO) -> bool:
    """Every SLO field that is set holds; a TPOT the request does not have counts as met."""
    if slo.ttft_s is not None and (r.ttft_s is None or r.ttft_s > slo.ttft_s):
        return False
    if slo.e2e_s is not None and (r.e2e_s is None or r.e2e_s > slo.e2e_s):
        return False
    tpot = tpot_s(r)
    return slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s


def distribution(values: list[float]) -> Dist:
    if not values:
        return Dist()
    p50, p90, p95, p99 = (float(v) for v in np.percentile(values, PERCENTILES))
    return Dist(len(values), float(np.mean(values)), p50, p90, p95, p99)


def _prompt_tokens(r: RequestResult) -> int:
    return r.prompt_tokens or r.planned.prompt_tokens  # 0: the server sent no usage


def _summarize_group(results: list[RequestResult], duration_s: float, slo: SLO | None,
                     label: str) -> Summary:
    ok = [r for r in results if r.outcome == "ok"]
    outcomes = dict.fromkeys(OUTCOMES, 0)
    for r in results:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    n = len(results)

    def share(outcome: str) -> float:
        return outcomes[outcome] / n if n else 0.0

    prompt = sum(_prompt_tokens(r) for r in ok)
    output = sum(r.output_tokens for r in ok)
    streamed = [r for r in ok if r.planned.stream]
    tpots = [t for t in map(tpot_s, streamed) if t is not None]
    given = slo is not None and any(v is not None for v in asdict(slo).values())
    lanes = {} if given else lane_slos(results)  # no SLO given: each lane's own (server's)
    checked = given or bool(lanes)
    if given:
        good = sum(meets_slo(r, slo) for r in ok)
    else:
        good = sum(meets_slo(r, lanes[r.server_lane]) for r in ok if r.server_lane in lanes)
    return Summary(
        label=label, duration_s=duration_s, requests=n, ok=len(ok), outcomes=outcomes,
        rejected_rate=share("rejected"), timeout_rate=share("timeout"),
        cancelled_rate=share("cancelled"), error_rate=share("error"),
        prompt_tokens=prompt, output_tokens=output,
        request_rps=len(ok) / duration_s, output_tps=output / duration_s,
        total_tps=(prompt + output) / duration_s,
        ttft=distribution([r.ttft_s for r in streamed if r.ttft_s is not None]),
        tpot=distribution(tpots),
        itl=distribution([gap for r in streamed for gap in itls_s(r)]),
        e2e=distribution([r.e2e_s for r in ok if r.e2e_s is not None]),
        ttft_gap=distribution([g for g in map(ttft_gap_s, ok) if g is not None]),
        e2e_gap=distribution([g for g in map(e2e_gap_s, ok) if g is not None]),
        slo=asdict(slo) if given else ({"by_lane": {k: asdict(v) for k, v in lanes.items()}}
                                       if lanes else None),
        goodput_rps=good / duration_s if checked else None,
        slo_met_share=good / len(ok) if checked and ok else None,
        slo_met=good if checked else None,
        resent=sum(r.sends > 1 for r in results),
        resent_ok=sum(r.sends > 1 for r in ok),
    )


def lane_slos(results: list[RequestResult]) -> dict[str, SLO]:
    """The SLO each lane's responses carried (batchpilot.slo), by the lane they ran in."""
    out: dict[str, SLO] = {}
    for r in results:
        if r.server_slo and r.server_lane and r.server_lane not in out:
            out[r.server_lane] = SLO(ttft_s=r.server_slo.get("ttft_s"),
                                     tpot_s=r.server_slo.get("tpot_s"))
    return out


def _groups(results: list[RequestResult], key: Callable[[RequestResult], str],
            duration_s: float, slo: SLO | None, label: str) -> dict[str, Summary]:
    members: dict[str, list[RequestResult]] = {}
    for r in results:
        members.setdefault(key(r), []).append(r)
    return {name: _summarize_group(members[name], duration_s, slo, label)
            for name in sorted(members)}


def summarize(results: list[RequestResult], duration_s: float, slo: SLO | None,
              label: str = "") -> Summary:
    """Metrics of one run; `duration_s`: its wall time, first send to last completion."""
    if duration_s <= 0:
        raise ValueError(f"{duration_s=} must be > 0 (first send to last completion)")
    summary = _summarize_group(results, duration_s, slo, label)
    summary.by_lane = _groups(
        results, lambda r: AUTO_LANE if r.planned.lane is None else r.planned.lane,
        duration_s, slo, label)
    summary.by_tenant = _groups(results, lambda r: r.planned.tenant, duration_s, slo, label)
    summary.by_server_lane = _groups([r for r in results if r.server_lane],
                                     lambda r: r.server_lane, duration_s, None, label)
    return summary


def summary_from_dict(d: dict) -> Summary:
    """The inverse of dataclasses.asdict(summary), e.g. for a summary read from the store."""
    d = dict(d)
    for name in LATENCIES + GAPS:
        d[name] = Dist(**d.get(name, {}))  # no gaps in results stored before they existed
    for groups in ("by_lane", "by_tenant", "by_server_lane"):
        d[groups] = {k: summary_from_dict(v) for k, v in d.get(groups, {}).items()}
    return Summary(**d)


def _dist_metric(name: str, stat: str) -> Callable[[Summary], float | None]:
    return lambda s: getattr(getattr(s, name), stat)


def _latency_rows() -> list[tuple[str, str, Callable[[Summary], float | None]]]:
    """ttft_mean..ttft_p99, then ttft_gap_p50/p99 next to them; tpot, itl; e2e, e2e_gap."""
    rows = []
    for name in LATENCIES:
        stats = [(name, stat) for stat in ("mean", "p50", "p90", "p95", "p99")]
        if f"{name}_gap" in GAPS:
            stats += [(f"{name}_gap", stat) for stat in ("p50", "p99")]
        rows += [(f"{n}_{stat}", "s", _dist_metric(n, stat)) for n, stat in stats]
    return rows


# (metric, unit, how to read it): the rows of compare() and of the report's main table
METRICS: list[tuple[str, str, Callable[[Summary], float | None]]] = [
    ("requests", "", lambda s: s.requests),
    ("ok", "", lambda s: s.ok),
    ("rejected_rate", "share", lambda s: s.rejected_rate),
    ("timeout_rate", "share", lambda s: s.timeout_rate),
    ("cancelled_rate", "share", lambda s: s.cancelled_rate),
    ("error_rate", "share", lambda s: s.error_rate),
    ("resent", "", lambda s: s.resent),
    ("resent_ok", "", lambda s: s.resent_ok),
    ("request_rps", "req/s", lambda s: s.request_rps),
    ("output_tps", "tok/s", lambda s: s.output_tps),
    ("total_tps", "tok/s", lambda s: s.total_tps),
    ("goodput_rps", "req/s", lambda s: s.goodput_rps),
    ("slo_met", "", lambda s: s.slo_met),
    ("slo_met_share", "share", lambda s: s.slo_met_share),
    *_latency_rows(),
]


def compare(summaries: list[Summary], baseline: int = 0) -> list[dict]:
    """Rows {metric, unit, values (one per summary), ratios (value / baseline's value;
    None where either is missing or the baseline's is 0)}, in METRICS order."""
    if not 0 <= baseline < len(summaries):
        raise ValueError(f"{baseline=} must index one of the {len(summaries)} summaries")
    rows = []
    for metric, unit, read in METRICS:
        values = [read(s) for s in summaries]
        base = values[baseline]
        ratios = [None if v is None or not base else v / base for v in values]
        rows.append({"metric": metric, "unit": unit, "values": values, "ratios": ratios})
    return rows
