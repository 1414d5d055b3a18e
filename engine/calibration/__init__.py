"""The step-cost model: what a step costs on this device by its composition (`step_law.py`:
`StepLaw`, fitted by non-negative least squares, `least_squares.py`), the start-up probe
steps it is fitted to (`probe.py`, through the real model runner) and the token budgets
fitted from it (`budget_fit.py`), the watch of served steps against it (`drift.py`,
held by the engine: the device's drift since start-up), and the CPU threads chosen from
those steps (`thread_governor.py`: one thread while another process holds a core). The
scheduler holds each step to the law (engine/scheduling/step_time.py), and what-if fits
the same law to a trace.
It may import the config, `engine.request` and `engine.records` (numpy; torch in the probe).
"""
