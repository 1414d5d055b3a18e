"""Records (engine/records.py): a request's record at its end, each derived latency from its
own two times and the outcome its finish reason counts as; a step's sample rows."""

from __future__ import annotations

from dataclasses import replace

import pytest
from engine_helpers import make_engine, prompt

from engine.records import PrefillChunk, SchedulerOutput
from engine.request import Request, SamplingParams

PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


def _one_record(**add_kwargs):
    engine, clock = make_engine(step_cost_s=0.25)  # one token a step, 0.25 s each
    arrived = clock() - 2.0  # reached the server 2 s before the engine saw it
    engine.add_request("a", prompt(1, 20), PARAMS, arrival_time=arrived, **add_kwargs)
    (record,) = [r for out in engine.run_until_done() for r in out.finished]
    return record, arrived


def test_a_record_derives_its_latencies_from_its_own_times():
    """Scheduled at once (2 s after arrival), first token after its 0.25 s prefill step,
    two more 0.25 s steps: queue delay 2.0, prefill 0.25, TTFT 2.25, end-to-end 2.75."""
    record, arrived = _one_record()
    assert record.first_scheduled_time == pytest.approx(arrived + 2.0)
    assert record.first_token_time == pytest.approx(arrived + 2.25)
    assert record.token_times[0] == record.first_token_time
    assert record.finished_time == pytest.approx(arrived + 2.75)
    assert record.queue_delay_s == pytest.approx(2.0)
    assert record.prefill_time_s == pytest.approx(0.25)
    assert record.ttft_s == pytest.approx(2.25)
    assert record.e2e_s == pytest.approx(2.75)
    assert record.decode_time_s == pytest.approx(0.5)


def test_a_request_that_reached_its_length_finished():
    """max_tokens reached is a finished request (as a stop is), not a failure."""
    record, _ = _one_record()
    assert (record.finish_reason, record.outcome) == ("length", "finished")
    assert replace(record, finish_reason="stop").outcome == "finished"
    assert replace(record, finish_reason="timeout").outcome == "timeout"
    assert replace(record, finish_reason="").outcome == "error"


def test_the_sample_rows_are_the_decodes_then_the_chunks_that_reach_their_last_token():
    """What an executor samples (the simulated one without its shadow KV, as the what-if
    replays run it): a prompt's middle chunk has no row, else its token lands on a request
    still prefilling and the step's tokens outnumber its rows."""
    a, b, c, d = (Request(rid, prompt(i, 40), PARAMS, 0.0) for i, rid in enumerate("abcd"))
    out = SchedulerOutput(1, [a, b], [PrefillChunk(c, 16, False), PrefillChunk(d, 40, True)],
                          0, 128)
    assert out.sample_requests() == [a, b, d]
    assert (out.num_seqs, out.is_empty) == (4, False)
