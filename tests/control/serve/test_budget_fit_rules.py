"""The start-up budget fit's record (engine/calibration/budget_fit.py) on a fake timer: the
note says the target is missed or the defaults already fit only when that is so, the
banner says which budget the operator set, and the probes stay within the KV pool. The
rule itself: test_budget_fitting.py."""

from __future__ import annotations

from engine.calibration.budget_fit import fit_step_budgets
from engine.config import EngineConfig, LiveConfig, StaticConfig
from tests.control.serve.test_budget_fitting import FakeProber, fit


def test_budgets_fitted_within_the_target_carry_no_note():
    """10 ms + 0.05 ms/token: 4800 tokens fit a 250 ms step; the chunk (largest power of
    two <= 3200) is the built-in 2048, the budget below the built-in 8192. Neither 'over
    the target' nor 'the defaults already fit' is true."""
    config, result = fit(law=(0.01, 0.00005))
    assert (config.live.prefill_chunk_size, config.live.max_num_batched_tokens) == (2048, 4800)
    assert result.predicted_ms(4800) <= 250
    assert result.note == ""
    assert not result.summary().endswith("over the target")


def test_the_banner_says_which_budget_the_operator_set():
    """The operator's chunk is not among the budgets "fitted to" the target (it read as
    if the fit had chosen it), and it is shown with its value where it was set."""
    _, result = fit({"prefill_chunk_size": 1024})
    fitted, _, rest = result.summary().partition(" fitted to ")
    assert fitted.startswith("budgets: max_num_batched_tokens=")
    assert "prefill_chunk_size" not in fitted
    assert "; set in config: prefill_chunk_size=1024;" in rest
    _, result = fit()
    assert "set in config" not in result.summary()


def test_the_probes_stay_within_a_kv_pool_smaller_than_max_model_len():
    """A 1024-token pool under a 32768-token max_model_len: on the real runner a probe
    needing more blocks than the pool has fails start-up (RunnerProbe raises)."""
    static = StaticConfig(num_kv_blocks=64, block_size=16, target_step_ms=250)
    config = EngineConfig(static, LiveConfig(max_num_seqs=8)).validate()
    timer = FakeProber(0.001, 1e-6)  # fast: the ramp runs to its largest size
    fit_step_budgets(config, set(), timer)
    pool = 64 * 16
    prefills = [start + n for kind, start, n in timer.calls if kind == "prefill"]
    decodes = [batch * context for kind, batch, context in timer.calls if kind == "decode"]
    assert prefills and decodes
    assert max(prefills) <= pool and max(decodes) <= pool, timer.calls


def test_probes_that_cost_the_same_at_every_size_are_called_out_not_called_a_fit():
    """Start-up beside three test runs on 2 cores timed every probe at ~2.5 s whatever its
    size: the law (2.49 s + 0 per token) kept the built-in budgets, and the banner said
    the defaults 'already fit' 250 ms steps it predicts at 2.5 s. The note says the target
    is missed and why the law cannot be the device's."""
    config, result = fit(law=(2.49, 0.0))
    assert config.live.max_num_batched_tokens == LiveConfig.max_num_batched_tokens
    assert "already fit" not in result.note
    assert result.note.startswith("a 8192-token step is predicted at 2490 ms, over the"
                                  " target; the probe steps took 2490 ms at every size")
    assert "not the device's" in result.summary()
    # a device whose fixed cost misses the target but whose tokens cost something: the
    # target is missed, and nothing suggests the probes were disturbed
    _, slow = fit(law=(0.3, 1e-7))
    assert "over the target" in slow.note and "every size" not in slow.note
