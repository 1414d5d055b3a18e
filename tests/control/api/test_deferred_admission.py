"""What a client and an operator see of a request admitted deferred (slo_unreachable: defer,
engine/lanes/admission.py): the response's X-Batchpilot-Admission header, and the
admissions counter's reason label; a plain admission shows neither. A resend (the SDKs'
X-Stainless-Retry-Count above 0) is deferred over HTTP too."""

from __future__ import annotations

import asyncio

from fixtures.serving import asgi_client, make_engine

from control.api.openai_format import ResponseFormat, from_decision
from control.api.request_meta import RequestMeta
from control.metrics.registry import ServingMetrics
from engine.calibration.step_law import StepLaw
from engine.config import LiveConfig
from engine.lanes.admission import SLO_DEFERRED
from engine.records import AdmissionDecision


def headers_for(decision: AdmissionDecision) -> dict[str, str]:
    meta = RequestMeta(tenant="t", lane=None, priority=0, deadline=None, timeout_s=60.0)
    fmt = ResponseFormat("chat", decision.request_id, "m", 5, meta)
    return from_decision(fmt, decision, LiveConfig()).start_headers()


def test_a_deferred_admission_is_named_in_the_response_headers():
    deferred = AdmissionDecision(True, "r1", SLO_DEFERRED, "why", lane="interactive")
    assert headers_for(deferred)["X-Batchpilot-Admission"] == "slo_deferred"
    plain = AdmissionDecision(True, "r2", lane="interactive")
    assert "X-Batchpilot-Admission" not in headers_for(plain)


def test_the_admissions_counter_labels_a_deferral_by_its_reason():
    metrics = ServingMetrics("m")
    metrics.observe_admission(AdmissionDecision(True, "r1", SLO_DEFERRED, lane="interactive"))
    metrics.observe_admission(AdmissionDecision(True, "r2", lane="interactive"))
    text = metrics.render()[0].decode()
    lines = [line for line in text.splitlines()
             if line.startswith("batchpilot_admission_decisions_total{")
             and 'decision="admitted"' in line]
    by_reason = {line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                 for line in lines}
    assert by_reason == {"slo_deferred": 1.0, "none": 1.0}


def test_a_resend_is_deferred_and_says_so(tiny_loaded):
    """The default policy (shed) with a step law: a first send on an idle server is on
    time; the same request sent again (X-Stainless-Retry-Count: 1) is deferred."""
    engine, _, settings = make_engine(tiny_loaded)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            await engine.call(lambda e: setattr(e.scheduler, "step_law",
                                                StepLaw(0.01, 0.001, 0.0, 0.0)))
            body = {"prompt": "Hi there", "max_tokens": 2}
            return [await client.post("/v1/completions", json=body,
                                      headers={"X-Stainless-Retry-Count": count})
                    for count in ("0", "1")]

    first, again = asyncio.run(scenario())
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert "X-Batchpilot-Admission" not in first.headers
    assert again.headers["X-Batchpilot-Admission"] == "slo_deferred"
