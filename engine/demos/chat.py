"""Chat with the default model through the offline API (`python -m engine.demos.chat`).

Loads SmolLM2-135M-Instruct from the bundled GGUF (the first load converts it, ~40 s; later
ones take ~1 s), answers a few questions as one batch through continuous batching, and
prints each answer with its timing. `--interactive` reads your own questions.
"""

from __future__ import annotations

import argparse
import time

from engine import LLM, SamplingParams

QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips for writing clear code.",
    "Explain what a KV cache is in one sentence.",
    "Write a haiku about autumn.",
)


def _print(question: str, out) -> None:
    m = out.metrics
    print(f"\n> {question}\n{out.text.strip()}")
    print(f"  [{len(out.token_ids)} tokens, {out.finish_reason}; TTFT {m.ttft_s:.2f}s,"
          f" TPOT {1000 * (m.tpot_s or 0):.0f}ms, E2E {m.e2e_s:.2f}s]")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--interactive", action="store_true")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    llm = LLM(args.model)
    print(f"loaded {args.model} in {time.perf_counter() - started:.1f}s "
          f"({llm.engine.static.num_kv_blocks} KV blocks of {llm.engine.static.block_size})")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    if not args.interactive:
        outs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS], params)
        for question, out in zip(QUESTIONS, outs, strict=True):
            _print(question, out)
        return
    history: list[dict] = []
    while True:
        try:
            question = input("\nyou> ").strip()
        except EOFError:
            return
        if not question:
            continue
        history.append({"role": "user", "content": question})
        out = llm.chat(history, params, use_tqdm=False)[0]
        history.append({"role": "assistant", "content": out.text})
        _print(question, out)


if __name__ == "__main__":
    main()
