"""Prometheus metrics from the engine's plain records; the engine imports none of this.

    observer.py  after each step the engine thread queues one StepItem; the "metrics"
                 thread turns it into metric values (and hands trace rows to trace/)
    registry.py  the metric families, their labels and /metrics rendering
    core.py      lock-free counters and histograms written by one thread, read by scrapes
    gateway.py   what gateways read: KV-pool info, and vLLM's names (--metrics-compat vllm)
"""
