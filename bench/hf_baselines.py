"""The sides of bench.offline_throughput that are not this tree's engine: transformers
`generate` in static batches, transformers' own continuous batching, and another commit's
engine in a subprocess (`--against REF`).

Every side gets the same prompts (token ids) and the same per-request output lengths,
greedy, EOS ignored, and returns (seconds, useful output tokens). Only the tokens each
request asked for count (a static batch runs until its longest request ends).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

CB_PAGE = 32  # tokens per page of transformers' paged cache
# The --against driver, run as `python -c DRIVER` with PYTHONPATH=<worktree> so `engine`
# comes from that commit. stdin: one JSON line {model, prompts, outputs, max_num_seqs}, then
# one line per timed run; stdout: one JSON line per run {"seconds", "tokens"}. It loads the
# model once, in that commit's default dtype (load_model(model), keep_reference off), and
# warms up on the first 4 requests before reading the first run line.
DRIVER = r"""
import json, sys, time
import torch
from engine import LLM, SamplingParams
from engine.models import load_model

torch.set_num_threads(int(sys.argv[1]))
out, sys.stdout = sys.stdout, sys.stderr  # the engine's own prints must not reach the pipe
spec = json.loads(sys.stdin.readline())
loaded = load_model(spec["model"])
prompts, outputs = spec["prompts"], spec["outputs"]

def run(p, o):  # a fresh engine per run, as the engine sides of offline_throughput
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in o]
    llm = LLM(loaded, max_num_seqs=spec["max_num_seqs"], max_num_batched_tokens=2048)
    start = time.perf_counter()
    results = llm.generate(p, params, use_tqdm=False)
    secs = time.perf_counter() - start
    assert [len(r.token_ids) for r in results] == o, "output lengths differ"
    return secs

run(prompts, outputs)  # warm-up on the whole workload, as the engine sides
print(json.dumps({"ready": str(loaded.dtype)}), file=out, flush=True)
for line in sys.stdin:
    print(json.dumps({"seconds": run(prompts, outputs), "tokens": sum(outputs)}), file=out,
          flush=True)
"""


def run_static(model, pad_id: int, prompts: list[list[int]], outputs: list[int],
               batch_size: int) -> tuple[float, int]:
    """transformers `generate` on left-padded static batches of `batch_size`, in order."""
    start = time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        batch, outs = prompts[b:b + batch_size], outputs[b:b + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        new = max(outs)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - start, sum(outputs)


def run_hf_cb(model, prompts: list[list[int]], outputs: list[int], max_batch: int,
              timeout_s: float = 900.0) -> tuple[float, int]:
    """transformers' ContinuousBatchingManager (paged cache, its own scheduler) with each
    request's own max_new_tokens, greedy, EOS off (eos_token_id=-1), at most `max_batch`
    requests per step and 2048 tokens (ours: max_num_seqs, max_num_batched_tokens). Timed
    from the first add_request to the last finished result; building the manager and its
    cache, and stopping it, are not timed (our engine's LLM is built once, outside the timing too).
    NOTE: transformers switches the model to a paged attention implementation for the run
    and back on stop; the static side runs on the same module, so stop() must happen."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=max(outputs), eos_token_id=-1)
    # NOTE: the cache is sized to the workload (every request's blocks at once, as ours
    # can hold them): left to size itself by free memory on CPU, its eager attention mask
    # ([batch tokens, batch tokens + cache tokens]) takes minutes to build and fill.
    blocks = sum(-(-(len(p) + n) // CB_PAGE) for p, n in zip(prompts, outputs, strict=True))
    config = ContinuousBatchingConfig(page_size=CB_PAGE, num_blocks=blocks + 8,
                                      max_requests_per_batch=max_batch, max_batch_tokens=2048)
    manager = model.init_continuous_batching(generation_config=gen,
                                             continuous_batching_config=config)
    manager.start()
    try:
        while manager.batch_processor is None and manager.is_running():
            time.sleep(0.01)  # the thread builds its cache first: not timed
        start = time.perf_counter()
        ids = [manager.add_request(p, request_id=f"r{i}", max_new_tokens=n, eos_token_id=-1)
               for i, (p, n) in enumerate(zip(prompts, outputs, strict=True))]
        done: dict[str, int] = {}
        while len(done) < len(ids):
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running() or time.perf_counter() - start > timeout_s:
                    raise RuntimeError(f"transformers CB stopped after {len(done)}/{len(ids)}"
                                       " requests")
                continue
            if result.is_finished():
                if result.error:
                    raise RuntimeError(f"transformers CB request failed: {result.error}")
                done[result.request_id] = len(result.generated_tokens)
        elapsed = time.perf_counter() - start
    finally:
        manager.stop(block=True, timeout=30)
        manager.destroy()
    got = [done[f"r{i}"] for i in range(len(ids))]
    if got != outputs:
        raise RuntimeError(f"transformers CB output lengths {got[:8]}... != asked {outputs[:8]}...")
    return elapsed, sum(outputs)


class RefEngine:
    """Another checkout's engine in a subprocess (see DRIVER); `run()` times one pass over
    the workload there. Start it before the rounds: loading and warm-up happen in __init__."""

    def __init__(self, tree: Path, model: str, prompts: list[list[int]], outputs: list[int],
                 max_num_seqs: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree)}  # only `tree` provides engine
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(torch.get_num_threads())], cwd=tree, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        spec = {"model": model, "prompts": prompts, "outputs": outputs,
                "max_num_seqs": max_num_seqs}
        self.ready = self._ask(json.dumps(spec))["ready"]

    def _ask(self, line: str) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            code = self.proc.wait()
            raise RuntimeError(f"the --against engine exited with {code} (its stderr is above)")
        return json.loads(answer)

    def run(self) -> tuple[float, int]:
        answer = self._ask("run")
        return answer["seconds"], answer["tokens"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
