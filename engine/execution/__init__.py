"""Running a step on the model: `ModelRunner` (`model_runner.py`) flattens a
`SchedulerOutput` into one forward pass over the paged KV cache and owns the weights, the
KV tensors and device state only; `sampler.py` samples one token per sample row (greedy,
temperature, top-k/top-p/min-p) after the logits processors (`logits_processors.py`:
penalties, logit bias, min_tokens), drawing each row's noise for the exponential race
(`exponential_race.py`) from its own request's generator. It decides nothing about which
tokens run. It may import `engine.request`, `engine.records`, `engine.logprobs`,
engine/models, engine/structured and kernels/; nothing of scheduling, lanes or KV blocks.
"""
