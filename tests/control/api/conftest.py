"""The API tests' engine: one per test module (module scope), on the tests' tiny model."""

import pytest
from fixtures.serving import make_engine


@pytest.fixture(scope="module")
def api(tiny_loaded):
    """(engine, settings) of a server app's engine with the default settings; stopped after
    the module's tests."""
    engine, _, settings = make_engine(tiny_loaded)
    yield engine, settings
    engine.stop()
