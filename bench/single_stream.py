"""Single-stream decode: our engine on the GGUF's blocks against llama.cpp on the same file.

One request at a time, greedy, --tokens tokens from the same short prompt (its prefill
included, as a user sees it), sides alternating A B C A B C ... in one process:

    gguf       LLM(dtype auto): decode steps on the GGUF's own blocks (SmolLM2: Q4_1 layers,
               Q8_0 head; engine/models/gguf_blocks.py), the native decode layers
    bf16       the same engine with the blocks set aside: the native layers on the bf16
               copies (what auto ran before the blocks)
    llama_cpp  llama-cpp-python's Llama on the same .gguf file, --threads threads, its own
               greedy loop (Llama.generate, temperature 0), when llama_cpp is importable:
               it is not a dependency of the project (it builds llama.cpp from source,
               ~5 minutes here); without it the side is left out and the output says so.
               On this VM llama.cpp's AMX matmul (built in by -march=native) segfaults in
               llama_decode (llama-cpp-python 0.3.36), so build it without AMX:
               CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON
               -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX_VNNI=ON
               -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
               pip install llama-cpp-python diskcache

Prints tokens/s per side (median [min-max] over --rounds) and the ratios of gguf to the
others; with llama.cpp also whether the greedy tokens agree (both compute the same
weights: llama.cpp quantizes the activations to 8 bits for its dot products, we do not,
so a near tie can go either way). The last stdout line is one JSON object.

    python -m bench.single_stream [--tokens 128] [--rounds 5] [--threads 2]
    python -m bench.single_stream --smoke   # the tests' tiny model rounded to Q4_1, seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.quantized_models import as_if_from_gguf, blocks_set_aside
from bench.random_models import run_bench
from engine import LLM, SamplingParams
from engine.models import load_model
from engine.models.sources import resolve_model_source

PROMPT = "Tell me a short story about a cat who learns to fly."
SMOKE = {"tokens": 8, "rounds": 2}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def our_side(llm: LLM, prompt_ids: list[int], tokens: int, blocks: bool):
    """() -> (seconds, token ids) of one greedy generate, on the blocks or beside them."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    def run() -> tuple[float, list[int]]:
        with blocks_set_aside(llm.loaded.model, aside=not blocks):
            started = time.perf_counter()
            out = llm.generate([prompt_ids], params, use_tqdm=False)[0]
            return time.perf_counter() - started, list(out.token_ids)
    return run


def llama_cpp_side(path: Path, prompt_ids: list[int], tokens: int, threads: int):
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=max(512, len(prompt_ids) + tokens + 8),
                n_threads=threads, n_threads_batch=threads, verbose=False)

    def run() -> tuple[float, list[int]]:
        llm.reset()
        started = time.perf_counter()
        out = []
        for token in llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True):
            out.append(int(token))
            if len(out) == tokens:
                break
        return time.perf_counter() - started, out
    return run


def build(model_name: str, args) -> tuple[dict, str]:
    loaded = load_model(model_name, dtype="auto")
    if args.smoke:  # the tiny model as if from a GGUF (no tokenizer inside: no llama.cpp)
        as_if_from_gguf(loaded.model)
    if loaded.model.gguf_layers_type is None:
        raise SystemExit(f"{model_name} has no GGUF blocks attached here (not a GGUF source,"
                         " or the native layers do not build): nothing to compare")
    llm = LLM(loaded, max_num_seqs=1)
    prompt_ids = loaded.tokenizer.encode(PROMPT)
    sides = {"gguf": our_side(llm, prompt_ids, args.tokens, True),
             "bf16": our_side(llm, prompt_ids, args.tokens, False)}
    source = resolve_model_source(model_name)
    if args.smoke or source.suffix.lower() != ".gguf":
        note = "llama_cpp left out: the model is not a GGUF file llama.cpp can load"
    elif importlib.util.find_spec("llama_cpp") is None:
        note = "llama_cpp left out: llama-cpp-python is not installed (see the docstring)"
    else:
        sides["llama_cpp"] = llama_cpp_side(source, prompt_ids, args.tokens, args.threads)
        note = f"llama_cpp: llama-cpp-python on {source.name}, {args.threads} threads"
    return sides, note


def measure(model_name: str, args) -> dict:
    sides, note = build(model_name, args)
    log(note)
    for run in sides.values():
        run()  # warm-up, untimed
    rates: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for name, run in sides.items():
            seconds, ids = run()
            rates[name].append(len(ids) / seconds)
            tokens[name] = ids
    # generated: the last round's token count (the rates divide it; each must be --tokens)
    result = {name: {"tok_s": statistics.median(v), "min": min(v), "max": max(v),
                     "generated": len(tokens[name])} for name, v in rates.items()}
    for name, side in result.items():
        log(f"  {name:<10} {side['tok_s']:6.1f} tok/s [{side['min']:.1f}-{side['max']:.1f}]")
    ratios = {f"gguf/{name}": result["gguf"]["tok_s"] / result[name]["tok_s"]
              for name in result if name != "gguf"}
    log("  ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    same = None
    if "llama_cpp" in tokens:
        n = min(len(tokens["gguf"]), len(tokens["llama_cpp"]))
        ours, theirs = tokens["gguf"][:n], tokens["llama_cpp"][:n]
        same = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), n)
        log(f"  greedy tokens equal to llama.cpp's for the first {same} of {len(ours)}")
    return {"model": model_name, "tokens": args.tokens, "rounds": args.rounds,
            "threads": torch.get_num_threads(), "note": note, "sides": result,
            "ratios": ratios, "tokens_equal_to_llama_cpp": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="alias or .gguf file")
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens per request")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every side")
    ap.add_argument("--threads", type=int, default=2, help="threads, ours and llama.cpp's")
    ap.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    run_bench("single_stream", ap.parse_args(), SMOKE, measure)


if __name__ == "__main__":
    main()
