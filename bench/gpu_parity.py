"""The engine on a GPU with Triton attention gives transformers' outputs.

1. Tiny fp32 checkpoints (tests/fixtures/tiny_models.py: Llama and Qwen2, GQA, head_dim 16):
   LLM.generate, greedy, 24 tokens for each of 8 prompts, against transformers' greedy loop
   over the full sequence (no cache) on the same GPU: the tokens must be identical.
2. SmolLM2-135M's shape with random weights (scaled for healthy logit margins), bf16: our
   model runs four sequences through mixed steps (whole prompts, chunks over cached
   prefixes, decodes) on the paged cache; every position's logits are compared with
   transformers' fp32 logits, and so are transformers' own bf16 logits. Ours pass when their
   mean |error| is at most twice transformers' bf16 error and top-1 agreement is within 2
   points of it.

    python -m bench.gpu_parity [--json out.json]
    python -m bench.gpu_parity --smoke   # CPU, Triton's interpreter, tiny sizes (seconds)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import torch

from bench.random_models import adopt, build_hf_model

PROMPTS = ["The scheduler", "Hello", "The quick brown fox jumps over the lazy dog",
           "Each block of the key value cache holds sixteen tokens of one sequence.",
           "Numbers like 1, 2, 3", "She sells sea shells", "When the cache is almost full",
           "Operators change the token budget while traffic flows"]


def hf_greedy(model, ids: list[int], num_tokens: int, device: str) -> list[int]:
    ids = list(ids)
    with torch.inference_mode():
        for _ in range(num_tokens):
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1]
            ids.append(int(torch.argmax(logits.float())))
    return ids[-num_tokens:]


def tiny_greedy_parity(device: str, prompts: list[str], num_tokens: int) -> list[dict]:
    import kernels
    from engine import LLM, SamplingParams
    from engine.models import load_model
    from tests.fixtures.tiny_models import TINY_LLAMA, TINY_QWEN2, write_checkpoint

    results = []
    for spec in (TINY_LLAMA, TINY_QWEN2):
        spec = dict(spec)
        arch, seed = spec.pop("arch"), spec.pop("seed")
        with tempfile.TemporaryDirectory() as tmp:
            path = write_checkpoint(Path(tmp), arch, seed, **spec)
            loaded = load_model(path, dtype=torch.float32, device=device, keep_reference=True)
        backend = kernels.use_attention_backend(loaded.model, "triton").name
        llm = LLM(loaded, max_num_seqs=8, num_kv_blocks=256, block_size=16)
        params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
        ours = [out.token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
        encode = loaded.tokenizer.encode
        theirs = [hf_greedy(loaded.reference, encode(p, add_special_tokens=False), num_tokens,
                            device) for p in prompts]
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        results.append({"check": f"tiny {arch} fp32 greedy", "backend": backend,
                        "prompts": len(prompts), "tokens_each": num_tokens, "identical": same,
                        "ok": same == len(prompts)})
        print(json.dumps(results[-1]), flush=True)
    return results


def paged_logits(loaded, seqs: list[list[int]], steps: list[list[int]], device: str):
    """Run `steps` (per step, tokens fed per sequence) -> float32 logits [len, V] per seq."""
    from engine.models import allocate_kv_caches, build_attention_metadata

    model, block_size = loaded.model, 16
    need = sum(-(-len(s) // block_size) for s in seqs)
    caches = allocate_kv_caches(model.num_layers, need + 8, block_size, model.num_kv_heads,
                                model.head_dim, loaded.dtype, device)
    for k_cache, v_cache in caches:  # garbage, so a stray read cannot look right
        k_cache.normal_()
        v_cache.normal_()
    free = list(range(need + 8))
    random.Random(0).shuffle(free)
    done, blocks = [0] * len(seqs), [[] for _ in seqs]
    logits: list[list[torch.Tensor]] = [[] for _ in seqs]
    for step in steps:
        active = [s for s, n in enumerate(step) if n]
        for s in active:
            while len(blocks[s]) * block_size < done[s] + step[s]:
                blocks[s].append(free.pop())
        positions, meta = build_attention_metadata(
            [blocks[s] for s in active], [done[s] + step[s] for s in active],
            [step[s] for s in active], block_size, device)
        ids = torch.tensor([t for s in active for t in seqs[s][done[s]:done[s] + step[s]]],
                           device=device)
        with torch.inference_mode():
            out = model.compute_logits(model(ids, positions, caches, meta))
        for s, chunk in zip(active, torch.split(out, [step[s] for s in active]), strict=True):
            logits[s].append(chunk)
            done[s] += step[s]
    return [torch.cat(chunks) for chunks in logits]


def bf16_logit_parity(device: str, lengths: list[int], **overrides) -> dict:
    """lengths: 4 prompt lengths, run as steps (whole | chunks of 40 + rest | 1 | half + half),
    then 3 decodes each; overrides: model config fields (--smoke's fewer layers)."""
    import kernels
    from tests.fixtures.tiny_models import init_weights

    hf32 = build_hf_model("smollm2-135m", torch.float32, device, attn_implementation="eager",
                          **overrides)
    init_weights(hf32, seed=7)
    hf16 = copy.deepcopy(hf32).to(torch.bfloat16)
    ours = adopt(hf32, torch.bfloat16, device, "smollm2-shaped")
    backend = kernels.use_attention_backend(ours.model, "triton").name
    rng = random.Random(1)
    seqs = [[rng.randrange(49152) for _ in range(n + 3)] for n in lengths]  # + 3 decodes
    a, b, c, d = lengths
    steps = [[a, min(40, b), c, d // 2], [0, b - min(40, b), 0, d - d // 2]] + [[1] * 4] * 3
    ours_logits = paged_logits(ours, seqs, steps, device)
    err = {"ours": [], "transformers_bf16": []}
    agree = {"ours": 0, "transformers_bf16": 0}
    with torch.inference_mode():
        for s, tokens in enumerate(seqs):
            ids = torch.tensor([tokens], device=device)
            ref = hf32(input_ids=ids).logits[0].float()
            for name, got in (("ours", ours_logits[s]),
                              ("transformers_bf16", hf16(input_ids=ids).logits[0].float())):
                err[name].append((got - ref).abs().flatten())
                agree[name] += int((got.argmax(-1) == ref.argmax(-1)).sum())
    positions = sum(len(t) for t in seqs)
    stats = {name: {"mean_abs": float(torch.cat(e).mean()), "max_abs": float(torch.cat(e).max()),
                    "top1_agreement": agree[name] / positions} for name, e in err.items()}
    ours, theirs = stats["ours"], stats["transformers_bf16"]
    ok = (ours["mean_abs"] <= 2 * theirs["mean_abs"]
          and ours["top1_agreement"] >= theirs["top1_agreement"] - 0.02)
    result = {"check": "smollm2-shaped bf16 logits vs transformers fp32", "backend": backend,
              "layers": hf32.config.num_hidden_layers, "positions": positions, **stats, "ok": ok}
    print(json.dumps(result), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the JSON result here")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, tiny sizes, Triton's interpreter (sets TRITON_INTERPRET=1)")
    args = parser.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
        checks = tiny_greedy_parity("cpu", PROMPTS[:2], 4)
        checks.append(bf16_logit_parity("cpu", [20, 50, 1, 70], num_hidden_layers=2))
    elif not torch.cuda.is_available():
        print("bench.gpu_parity needs a CUDA GPU and torch.cuda.is_available() is False "
              "(--smoke runs it on CPU at tiny sizes)", file=sys.stderr)
        return 2
    else:
        checks = tiny_greedy_parity("cuda", PROMPTS, 24)
        checks.append(bf16_logit_parity("cuda", [300, 77, 1, 1000]))
    result = {"bench": "gpu_parity", "ok": all(c["ok"] for c in checks), "checks": checks,
              "device": "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
