"""The runnable demos (engine/demos): what they print is what they measured, and the chat
keeps the conversation. The chat's model is a stand-in here (no weights load)."""

from __future__ import annotations

import builtins
import re
from types import SimpleNamespace

from engine.demos import chat, replay
from engine.sim.workload import TraceScale, load_trace


def test_the_replay_demo_reports_every_request_and_its_output_rate(capsys):
    replay.main(["--requests", "30"])
    out = capsys.readouterr().out
    assert "outcomes: {'length': 30}, rejected: 0" in out
    lanes = re.findall(r"^(interactive|batch|long_context)\s+(\d+)\s", out, re.M)
    assert sum(int(n) for _, n in lanes) == 30
    steps, seconds, rate = re.search(
        r"(\d+) steps over ([\d.]+) simulated seconds; ([\d.]+) output tokens/s", out).groups()
    trace = load_trace(limit=30, scale=TraceScale(prompt_div=4, output_div=4, time_div=1.5,
                                                  min_tokens=4))
    tokens = sum(t.output_tokens for t in trace)  # forced: every request its trace length
    assert abs(float(rate) - tokens / float(seconds)) < 0.01 * float(rate) + 0.1
    assert int(steps) > 0


def test_the_chat_demo_prints_tpot_in_milliseconds(capsys):
    metrics = SimpleNamespace(ttft_s=0.25, tpot_s=0.025, e2e_s=1.5)
    chat._print("Q?", SimpleNamespace(text=" A. ", token_ids=[1, 2, 3], finish_reason="stop",
                                      metrics=metrics))
    out = capsys.readouterr().out
    assert "> Q?\nA.\n" in out
    assert "[3 tokens, stop; TTFT 0.25s, TPOT 25ms, E2E 1.50s]" in out


class FakeLLM:
    """The offline API's chat, answering each conversation with how many turns it saw."""

    conversations: list[list[dict]] = []

    def __init__(self, model: str):
        self.engine = SimpleNamespace(static=SimpleNamespace(num_kv_blocks=8, block_size=16))

    def chat(self, messages, params, use_tqdm=True):
        FakeLLM.conversations.append([dict(m) for m in messages])
        metrics = SimpleNamespace(ttft_s=0.1, tpot_s=0.01, e2e_s=0.2)
        return [SimpleNamespace(text=f"answer {len(messages)}", token_ids=[1],
                                finish_reason="stop", metrics=metrics)]


def test_the_interactive_chat_sends_the_whole_conversation_each_turn(monkeypatch, capsys):
    """Each question goes with the earlier questions and the model's own answers (a blank
    line asks nothing); end of input ends the chat."""
    lines = iter(["first", "  ", "second"])

    def fake_input(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    FakeLLM.conversations = []
    monkeypatch.setattr(chat, "LLM", FakeLLM)
    monkeypatch.setattr(builtins, "input", fake_input)
    chat.main(["--interactive"])
    assert FakeLLM.conversations == [
        [{"role": "user", "content": "first"}],
        [{"role": "user", "content": "first"}, {"role": "assistant", "content": "answer 1"},
         {"role": "user", "content": "second"}]]
    assert "answer 3" in capsys.readouterr().out
