"""Where requests wait, and who may wait: the lanes' queues and their fair-share accounting
(`queues.py`: `LaneQueue`, `LaneSet`), per-tenant state of active tenants only
(`tenants.py`), queue timeouts found by time (`queue_timeouts.py`), which lane a request
joins and where a removed lane's requests move (`routing.py`), admission at arrival
(`admission.py`: accept, or reject with a reason) and the recount of every lane counter
from the requests (`integrity.py`, which the engine calls). The lanes own the queued
requests and the per-lane and per-tenant counters; only the scheduler's verbs change them.
It may import the config, `engine.request`, `engine.records` and `engine.errors`; never the
scheduler, the KV pool or the executor.
"""
