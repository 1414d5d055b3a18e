#!/usr/bin/env bash
# Every GPU check of the Triton attention backend, in order, within 8 minutes:
#   kernel_check   kernels against the torch reference at real sizes    bench.kernel_check
#   kernel_speed   decode bandwidth, prefill TFLOP/s, vs SDPA             bench.kernel_speed
#   parity         engine vs transformers: tiny fp32 greedy, bf16 logits  bench.gpu_parity
#   engine_*       engine tokens/s vs transformers generate, per model    bench.gpu_engine
# Each step runs as `python -m bench.NAME ... --json FILE` with its own time limit (465 s in
# all), so one slow step cannot starve the rest. Needs only torch, triton and transformers
# plus this repository: no pip, no downloads. Writes gpu_check.json (every step's result,
# exit status and seconds) and the steps' logs to $OUT when set, else to the current
# directory. Exit status: 0 all passed, 1 a step failed, 2 no GPU (or no torch, triton or
# transformers).
#
#     bash bench/gpu_check.sh              # from anywhere; PYTHON=... picks the interpreter
#     bash bench/gpu_check.sh --dry-run    # CPU: every step with --smoke (tiny sizes, Triton's
#                                          # interpreter), the same gpu_check.json
# The dry run (tests/bench runs it) skips only the "no CUDA" exit, and gives each step 240 s
# (CPU speed, not a GPU's). It shows that every step starts and writes its JSON; its figures
# mean nothing, and the JSON says so ("dry_run": true, devices "cpu ...").
set -u
GPU_CHECK_DRY_RUN=
case "${1:-}" in
    --dry-run) GPU_CHECK_DRY_RUN=1 ;;
    "") ;;
    *) echo "usage: bash bench/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac
export GPU_CHECK_DRY_RUN
if [ -n "$GPU_CHECK_DRY_RUN" ]; then
    export TRITON_INTERPRET=1  # Triton kernels run on CPU only in its interpreter
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-$(command -v python || command -v python3)}
DEST=$(mkdir -p "${OUT:-.}" && cd "${OUT:-.}" && pwd)
WORK="$DEST/gpu_check_logs"
mkdir -p "$WORK"
: > "$WORK/steps"

"$PY" - <<'EOF' || exit 2
import os
import sys
try:
    import torch
    import transformers
    import triton
except ImportError as exc:
    sys.exit(f"gpu_check: {exc}: run with PYTHON=<an interpreter with torch, triton and "
             "transformers>")
if os.environ["GPU_CHECK_DRY_RUN"]:
    device = "cpu (dry run: every step with --smoke)"
elif torch.cuda.is_available():
    device = torch.cuda.get_device_name()
else:
    sys.exit("gpu_check: no CUDA GPU (torch.cuda.is_available() is False); nothing to check "
             "(--dry-run checks the script itself on CPU)")
print(f"gpu_check: {device}, torch {torch.__version__}, triton {triton.__version__}, "
      f"transformers {transformers.__version__}")
EOF

# name, time limit (s), module, arguments...: runs `python -m MODULE ARGS --json FILE` (with
# --smoke and a 240 s limit in a dry run), records its exit status and seconds
run_step() {
    local name=$1 limit=$2 module=$3
    shift 3
    if [ -n "$GPU_CHECK_DRY_RUN" ]; then
        set -- "$@" --smoke
        limit=240
    fi
    local start=$SECONDS
    echo "== $name (limit ${limit}s): python -m $module $*"
    timeout --kill-after=10 "$limit" "$PY" -m "$module" "$@" --json "$WORK/$name.json" \
        > "$WORK/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$WORK/$name.log"
    echo "$name $rc $((SECONDS - start))" >> "$WORK/steps"
}

run_step kernel_check 75 bench.kernel_check
run_step kernel_speed 105 bench.kernel_speed
run_step parity 75 bench.gpu_parity
run_step engine_smollm2 100 bench.gpu_engine --models smollm2-135m
run_step engine_llama1b 110 bench.gpu_engine --models llama-1b

"$PY" - "$WORK" "$DEST/gpu_check.json" <<'EOF'
import json
import os
import sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
steps = {}
for line in (work / "steps").read_text().split("\n"):
    if not line.strip():
        continue
    name, rc, seconds = line.split()
    path = work / f"{name}.json"
    result = json.loads(path.read_text()) if path.exists() else None
    status = "ok" if rc == "0" else ("timeout" if rc in ("124", "137") else f"failed (rc {rc})")
    steps[name] = {"status": status, "seconds": int(seconds), "result": result}
headline = {}
kernels = (steps.get("kernel_speed") or {}).get("result") or {}
if kernels:
    headline["device"] = kernels["device"]
    headline["decode_b64_ctx4k_fraction_of_peak"] = kernels["goal"]["achieved"]
    headline["decode_goal_met"] = kernels["goal"]["met"]
    headline["prefill_tflop_per_s"] = [round(p["tflop_per_s"], 1) for p in kernels["prefill"]]
for name in ("engine_smollm2", "engine_llama1b"):
    for model in ((steps.get(name) or {}).get("result") or {}).get("models", []):
        headline[f"engine_vs_transformers_{model['model']}"] = round(model["ratio"], 2)
for name in ("kernel_check", "parity"):
    result = (steps.get(name) or {}).get("result") or {}
    headline[f"{name}_ok"] = result.get("ok")
summary = {"ok": all(s["status"] == "ok" for s in steps.values()),
           "dry_run": bool(os.environ["GPU_CHECK_DRY_RUN"]), "headline": headline,
           "steps": steps}
out.write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps({"ok": summary["ok"], "dry_run": summary["dry_run"], **headline}))
for name, step in steps.items():
    print(f"  {name:16} {step['status']:14} {step['seconds']:4d} s")
print(f"gpu_check: summary in {out}, logs in {work}")
sys.exit(0 if summary["ok"] else 1)
EOF
