"""The goodput policy's step sizes in the trace (engine/scheduling/goodput.py): each step's
target and reason are written to `steps`, shown by `trace steps`, and `trace slow` says
which step sizes a slow request waited through; a shed request is in `admissions`."""

from __future__ import annotations

from control.metrics.observer import Observer
from control.trace import format as fmt
from control.trace import queries
from control.trace.store import open_read_only
from control.trace.writer import TraceSettings, TraceWriter
from engine.calibration.step_law import StepLaw, chunk_pairs
from engine.config import EngineConfig, LaneConfig, LaneSLO, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.sim.executor import FakeClock, SimulatedExecutor

LAW = StepLaw(0.040, 0.0008, 0.7e-6, 7.5e-6)
START = 1_700_000_000.0


def law_cost(out) -> float:
    pairs = sum(chunk_pairs(c.request.num_computed_tokens, c.num_tokens) for c in out.prefills)
    context = sum(r.num_computed_tokens + 1 for r in out.decodes)
    return LAW.step_s(out.num_tokens, pairs, context)


def record_burst(path: str, n: int = 30, length: int = 400) -> None:
    clock = FakeClock(START)
    executor = SimulatedExecutor(clock=clock, cost_model=law_cost, shadow_kv=False)
    live = LiveConfig(lanes=(LaneConfig("chat", slo=LaneSLO(ttft_s=3.0, tpot_s=1.0)),),
                      default_lane="chat", long_context_lane=None, max_num_seqs=64,
                      prefill_chunk_size=128, max_num_batched_tokens=192)
    static = StaticConfig(num_kv_blocks=4096, max_model_len=8192, target_step_ms=250)
    engine = Engine(EngineConfig(static, live), executor, clock=clock, step_law=LAW)
    writer = TraceWriter(TraceSettings(path), "run1", "sim").start()
    observer = Observer(None, writer, kv_snapshot_every=50)
    for i in range(n):
        engine.add_request(f"r{i}", [3 + (i * 31 + k) % 30000 for k in range(length)],
                           SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        observer.on_step(engine, engine.step())
    assert writer.sync(30)
    observer.stop()
    writer.stop()


def test_steps_carry_their_target_and_reason_and_slow_requests_say_what_they_waited_through(
        tmp_path):
    path = str(tmp_path / "trace.duckdb")
    record_burst(path)
    con = open_read_only(path)
    try:
        reasons = dict(con.execute("SELECT step_reason, count(*) FROM steps GROUP BY ALL")
                       .fetchall())
        targets = {r: t for r, t in con.execute(
            "SELECT step_reason, max(target_step_s) FROM steps GROUP BY ALL").fetchall()}
        shed = con.execute("SELECT count(*), min(retry_after_s) FROM admissions WHERE"
                           " reason = 'slo_unreachable'").fetchone()
        steps = queries.steps(con, limit=5000)
        slow = queries.slow(con, limit=3, by="ttft_s")
    finally:
        con.close()
    assert set(reasons) <= {"target", "grow_for_slo", "grow_for_throughput"}
    assert reasons.get("grow_for_slo", 0) + reasons.get("grow_for_throughput", 0) > 0
    assert max(targets.values()) > 0.25 and min(targets.values()) >= 0.25
    assert shed[0] > 0 and shed[1] >= 1.0  # the queue kept some from their TTFT
    grown = next(s for s in steps if s["step_reason"] != "target")
    line = fmt.steps([grown])
    assert grown["step_reason"] in line and "target:" in line
    assert slow and all(r["step_reasons"] for r in slow)
    text = fmt.slow(slow, "ttft_s")
    assert "steps until 1st token" in text
    top = max(slow[0]["step_reasons"], key=slow[0]["step_reasons"].get)
    assert f"{top} {slow[0]['step_reasons'][top]}/" in text
