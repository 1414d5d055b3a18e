"""Issue 17.5: a limit that would reject every request is refused when the config is
validated (file, profile, live change), with a message an operator can act on."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine

from engine.config import LiveConfig, StaticConfig
from engine.config.yaml_loader import load_config_dict

MESSAGE = "max_waiting_requests=0 must be >= 1"


def test_zero_waiting_requests_is_refused():
    with pytest.raises(ValueError, match=MESSAGE) as exc:
        LiveConfig(max_waiting_requests=0).validate(StaticConfig())
    assert "queue_full" in str(exc.value)  # says what 0 would do
    LiveConfig(max_waiting_requests=1).validate(StaticConfig())


def test_zero_waiting_requests_is_refused_in_a_file_and_in_a_profile():
    with pytest.raises(ValueError, match=MESSAGE):
        load_config_dict({"serving": {"max_waiting_requests": 0}})
    with pytest.raises(ValueError, match=f"profiles.shed: {MESSAGE}"):
        load_config_dict({"profiles": {"shed": {"max_waiting_requests": 0}}})


def test_zero_waiting_requests_is_refused_live_and_the_old_config_stays():
    engine, _ = make_engine()
    before = engine.live_config
    with pytest.raises(ValueError, match=MESSAGE):
        engine.update_config(before.replace(max_waiting_requests=0))
    assert engine.live_config is before
