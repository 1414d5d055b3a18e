"""What a prediction says it assumed (control/whatif/run.py): the caller's notes and the
reconstructed config's notes both reach the result, the caller's first."""

from __future__ import annotations

from whatif_sim_trace import STATIC, read_trace_window, record

from control.whatif.run import predict
from engine.config import EngineConfig, LiveConfig

LIVE = LiveConfig(max_num_seqs=8, max_num_batched_tokens=256, prefill_chunk_size=128)


def test_the_result_carries_the_callers_and_the_reconstructed_configs_notes(tmp_path):
    path = str(tmp_path / "trace.duckdb")
    record(path, LIVE, n=30)
    window = read_trace_window(path)
    result = predict(window, EngineConfig(STATIC, LIVE), {"p": {"max_num_seqs": 4}},
                     notes=["no serving YAML: assumed the defaults"])
    notes = result["notes"]
    assert notes[0] == "no serving YAML: assumed the defaults"
    trace_note = next((n for n in notes if n.startswith("from the trace:")), None)
    assert trace_note is not None, notes  # what was taken from the trace, not a YAML
    assert "max_num_seqs=8" in trace_note and "num_kv_blocks=" in trace_note
