"""OpenVINO GenAI as a peer of bench.cpu_peers: its own venv, the model exported into it, and
a driver process that times its pipelines on token ids we send.

OpenVINO GenAI is not a project dependency, and its exporter (optimum-intel) pins
transformers < 5.6 where the project needs >= 5.17, so the peer lives in a venv of its own
under the cache folder ($BATCHPILOT_CACHE_DIR, default ~/.cache/batchpilot, then peers/):

    python -m bench.cpu_peers --setup      # the venv (pinned CPU torch, optimum-intel,
                                           # openvino-genai) and the default model exported

The export is optimum-cli's own (`optimum-cli export openvino --weight-format fp16`) over the
checkpoint our loader reads (the GGUF dequantised to float32, written as a transformers
folder), so both sides run the same weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import venv
from pathlib import Path

# What --setup installs into the peer venv. torch first and pinned: an unpinned one pulls a
# multi-GB CUDA build; optimum-intel drags in a torchvision that does not match that torch
# and breaks the export, so it is removed after (the export does not need it).
PEER_PACKAGES = ("optimum-intel[openvino]==2.2.0", "openvino-genai==2026.4.1.0")
TORCH = "torch==2.13.0"

# Run as `PEER_PYTHON -c DRIVER OV_DIR THREADS`. stdin: one JSON line {prompts, outputs,
# max_num_seqs, max_num_batched_tokens}, then one JSON line per timed run, {"batched": true}
# or {"single": [prompt ids], "tokens": n}; stdout: one JSON line per run {"seconds",
# "tokens"} ("ttft_s" too for single). It warms both pipelines up before its first answer.
DRIVER = r"""
import json, sys, time
import numpy as np
import openvino as ov
import openvino_genai as og

path, threads = sys.argv[1], int(sys.argv[2])
out, sys.stdout = sys.stdout, sys.stderr
spec = json.loads(sys.stdin.readline())
props = {"INFERENCE_NUM_THREADS": threads}
sched = og.SchedulerConfig()
sched.max_num_seqs = spec["max_num_seqs"]
sched.max_num_batched_tokens = spec["max_num_batched_tokens"]
sched.cache_size = 2  # GB of KV cache: every request of the workload at once
batched = og.ContinuousBatchingPipeline(path, sched, "CPU", props)
single = og.LLMPipeline(path, "CPU", **props)

def config(n):
    g = og.GenerationConfig()
    g.max_new_tokens, g.min_new_tokens, g.ignore_eos, g.do_sample = n, n, True, False
    return g

def ids(p):
    return ov.Tensor(np.array([p], dtype=np.int64))

def run_batched():
    inputs = [ids(p) for p in spec["prompts"]]
    configs = [config(n) for n in spec["outputs"]]
    start = time.perf_counter()
    results = batched.generate(inputs, configs)
    secs = time.perf_counter() - start
    got = [len(r.m_generation_ids[0]) for r in results]
    assert got == spec["outputs"], f"output lengths {got[:8]} != {spec['outputs'][:8]}"
    return {"seconds": secs, "tokens": sum(got)}

def run_single(prompt, n):
    start = time.perf_counter()
    single.generate(ids(prompt), config(1))
    ttft = time.perf_counter() - start
    start = time.perf_counter()
    result = single.generate(ids(prompt), config(n))
    secs = time.perf_counter() - start
    assert len(result.tokens[0]) == n, len(result.tokens[0])
    return {"seconds": secs, "tokens": n, "ttft_s": ttft}

run_batched()
run_single(spec["prompts"][0], 8)
print(json.dumps({"ready": og.__version__}), file=out, flush=True)
for line in sys.stdin:
    ask = json.loads(line)
    answer = run_batched() if ask.get("batched") else run_single(ask["single"], ask["tokens"])
    print(json.dumps(answer), file=out, flush=True)
"""


def peers_dir() -> Path:
    configured = os.environ.get("BATCHPILOT_CACHE_DIR")
    root = Path(configured) if configured else Path.home() / ".cache" / "batchpilot"
    return root / "peers"


def peer_python() -> Path:
    return peers_dir() / "venv" / "bin" / "python"


def missing_reason() -> str | None:
    """Why the peer cannot run here (None when it can): no venv, or no openvino_genai in it."""
    python = peer_python()
    if not python.exists():
        return f"no peer venv at {python.parent.parent}: run python -m bench.cpu_peers --setup"
    probe = subprocess.run([str(python), "-c", "import openvino_genai"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"openvino_genai does not import in {python}: {tail}; rerun --setup"
    return None


def setup_venv() -> None:
    """The peer venv with PEER_PACKAGES (minutes: downloads from the package registry)."""
    folder = peers_dir() / "venv"
    if not peer_python().exists():
        print(f"creating {folder}", flush=True)
        venv.create(folder, with_pip=True)
    pip = [str(peer_python()), "-m", "pip", "install", "-q"]
    for packages in ((TORCH,), PEER_PACKAGES):
        print(f"pip install {' '.join(packages)}", flush=True)
        subprocess.run([*pip, *packages], check=True)
    subprocess.run([str(peer_python()), "-m", "pip", "uninstall", "-q", "-y", "torchvision"],
                   check=False)


def exported(model: str) -> Path:
    """The OpenVINO IR folder of `model` (an alias or a checkpoint folder) in the peer cache,
    exported on first use: our loader's float32 weights written as a transformers folder,
    then optimum-cli's export at fp16 weights (its tokenizer converted beside it)."""
    key = model if "/" not in model else hashlib.sha256(model.encode()).hexdigest()[:12]
    ov_dir = peers_dir() / "models" / f"{key}-ov-fp16"
    if (ov_dir / "openvino_model.xml").exists():
        return ov_dir
    hf_dir = peers_dir() / "models" / f"{key}-hf"
    if not (hf_dir / "config.json").exists():
        from engine.models import load_model

        loaded = load_model(model, dtype="float32", keep_reference=True)
        loaded.reference.save_pretrained(hf_dir)
        loaded.tokenizer.save_pretrained(hf_dir)
    cli = peer_python().parent / "optimum-cli"
    print(f"exporting {model} to {ov_dir} (optimum-cli, fp16 weights)", flush=True)
    subprocess.run([str(cli), "export", "openvino", "--model", str(hf_dir), "--task",
                    "text-generation-with-past", "--weight-format", "fp16", str(ov_dir)],
                   check=True)
    return ov_dir


class OpenVinoPeer:
    """The driver process (see DRIVER) on `ov_dir`; `batched()` and `single()` time one run
    there. Loading and warm-up happen in __init__, before any round."""

    def __init__(self, ov_dir: Path, threads: int, prompts: list[list[int]],
                 outputs: list[int], max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.proc = subprocess.Popen([str(peer_python()), "-c", DRIVER, str(ov_dir),
                                      str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.version = self._ask({"prompts": prompts, "outputs": outputs,
                                  "max_num_seqs": max_num_seqs,
                                  "max_num_batched_tokens": max_num_batched_tokens})["ready"]

    def batched(self) -> dict:
        return self._ask({"batched": True})

    def single(self, prompt: list[int], tokens: int) -> dict:
        return self._ask({"single": prompt, "tokens": tokens})

    def _ask(self, message: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the OpenVINO driver exited ({self.proc.wait()}): see stderr")
        return json.loads(answer)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
