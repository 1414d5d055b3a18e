"""Benchmarks and GPU checks. Run each from the repository root as `python -m bench.NAME`;
`--smoke` runs any of them end to end at tiny sizes in seconds (on CPU; the GPU ones in
Triton's interpreter), which is what tests/bench does in CI. Figures: bench/RESULTS.md.

CPU, side by side in one run:
    scheduler_overhead   engine µs per step; continuous vs static batching in steps
                         (`--against REF`: per-step cost beside another commit, A B A B)
    trace_overhead       engine steps/s with observability off, metrics, metrics + trace
    offline_throughput   LLM.generate (dtype auto, float32) vs transformers generate in
                         static batches and its continuous batching, SmolLM2-135M, tokens/s
                         (`--against REF`: also that commit's engine)
    loadtest_goals       continuous/static goodput, chunked/unchunked p99 ITL over HTTP
    tuning_sweep         playbooks/tuning.md's sweeps: max_num_seqs, token budget
    dashboard_load       dashboard page load time over a day of traces
    hostile_traffic      disconnects, a 5x burst, 20k one-off tenants: KV back at idle,
                         only 200/429/503, idle step cost after / before; poison:
                         innocents beside malformed requests (A B A B): none disturbed,
                         no 5xx, their p99 TPOT with / without
    openapi_fuzz         schemathesis over every operation in /openapi.json, in process:
                         no 5xx, no logged exception (tens of thousands of cases)
    goodput_policy       the Azure replay at 0.7/1.0/1.5x capacity and a mixed scenario:
                         goodput of the goodput policy vs fitted budgets, the fixed step
                         law and fixed budgets (simulated engine, CPU-like step costs)
    step_cost_drift      a CPU hog started mid-run: seconds until the step cost's drift
                         passes 1.5, and the scheduler's law scale before and during it
    step_law_fit         decode steps of 1-48 decodes measured against the start-up step
                         law and against one law for both kinds of step: measured / predicted
    lane_preemption      interactive TTFT p99 under a batch flood, preempt_to_start on vs
                         off (simulated engine), and what it costs the batch work
    latency_reconcile    client vs server TTFT and queue delay behind a long prefill and
                         on a long-prompt replay (`--against REF`: before / after)
    cpu_roofline         measured fp32/bf16 GEMM and weight-streaming ceilings beside the
                         engine's step split (projections, attention, sampling, other)
    cpu_attention_ab     CPU attention: committed vs torch path vs native decode kernel,
                         per layer stack and per engine step, batch 1/16/64 and mixed
    native_layers_ab     engine decode steps of 1-32 rows: torch layers vs the native layers
                         (fp32, bf16 copies, GGUF blocks)
    dtype_agreement      greedy tokens of dtype auto / bfloat16 against float32, parity prompts
    malloc_tuning        one LLM serving offline_throughput's workload round after round,
                         glibc's malloc thresholds (engine/execution/native_heap.py) on vs
                         off, each side in its own processes: tok/s and page faults a round
    single_stream        one request at a time: GGUF blocks vs bf16 copies vs llama.cpp
    serving_path         offline_throughput's workload through LLM offline vs `make run`'s
                         server at saturation over HTTP: output tok/s, server / offline
    cpu_peers            offline_throughput's workload and one stream beside OpenVINO
                         GenAI's ContinuousBatchingPipeline / LLMPipeline (`--setup` once:
                         its own venv and the export; without it, ours alone)
    fused_layers_ab      prefills and steps of over 20 decodes: torch ops vs the fused
                         native work between projections (bf16 copies)
    whatif_speed         `batchpilot whatif` over a synthetic day and an hour of it: read,
                         fit, replays, each timed (goals: 60 s and 5 s)
    whatif_accuracy      what-if predictions vs live load-test runs on the bundled model:
                         self and cross-config error per metric, and the sign of each change
    fleet_routing        precise (KV events), an oracle, affinity and random routing over
                         two in-process replicas (no Ray): prefix hit rate, TTFT p50/p99
    fleet_control        a fleet config change's time to reach every replica, idle vs
                         under load, and canaries of a bad and a good change (local Ray)
    fleet_scaling        1 vs 2 replicas on local Ray: burst capacity, and throughput, TTFT
                         and TPOT at one replica's capacity (A B A B, one fleet per side)
    fleet_autoscale      a burst scales an autoscaled fleet 1 -> 2, idle scales it back;
                         requests failed or missing, by the client and the traces
GPU (CUDA; all in order by `bash bench/gpu_check.sh`, whose `--dry-run` is the CPU check):
    kernel_check         Triton kernels against the torch reference at real sizes
    kernel_speed         decode bandwidth and prefill TFLOP/s, against torch SDPA
    gpu_parity           engine vs transformers: fp32 greedy tokens, bf16 logits
    gpu_engine           engine vs transformers generate, tokens/s, random-weight models
    kernel_compile       compiles the kernels for sm_90 on any machine: registers, spills
Helpers (no main): step_cost (scheduler_overhead's driver), paged_inputs, random_models,
roofline_steps (cpu_roofline's step), roofline_profile (its profiled split), hf_baselines
(offline_throughput's transformers sides and its --against driver), quantized_models (a
model rounded to GGUF blocks and written as a GGUF, for the block path's smoke runs and
tests), poison_requests (hostile_traffic's malformed requests, by kind), poison_phase (its
A B poison phase), raw_http (one request over a raw socket, bytes as given), openvino_peer
(cpu_peers' peer: its venv, the export and its driver process), otlp_sink (trace_overhead's
OTLP receiver, in a process of its own), fleet_routing_bed (fleet_routing's replicas,
ingress and workloads) and stream_client (serving_path's client: many streams at once,
parsed after the last one ends).

Nothing here is imported by the engine; the GPU modules import only torch, triton,
transformers (and what they bring) and this repository.
"""
