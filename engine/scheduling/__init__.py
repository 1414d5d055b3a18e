"""Each step, which requests run how many tokens: the scheduler (`scheduler.py`) on its
state (`state.py`: `SchedulerState`, the running set and the three verbs start, preempt,
finish), the step's token and time budgets (`budget.py`, `step_time.py`), each step's time target
for the lanes' SLOs (`goodput.py`), admission's SLO estimates (`slo_estimates.py`: a
request's TTFT, and a deferred one's start, with `spare_rate.py`), new prefills from
the lanes (`new_prefills.py`), preemption victims (`preemption.py`), fair-share charges
(`fair_share.py`), started requests' deadlines (`deadlines.py`) and the sampled tokens
applied after execute (`apply_sampled.py`). It owns the running set, the installed
`LiveConfig` and the step counter. Its parts import downward only (each part takes a
`SchedulerState`; nothing here imports scheduler.py but the engine): it may import the
config, `engine.request`, `engine.records`, `engine.errors`, `engine.logprobs`,
engine/lanes, engine/kv and engine/calibration's step law; never the engine or the executor.
"""
