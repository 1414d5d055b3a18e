"""The app's lifespan (control/api/app.py): once the model loaded, the trace's run settings
keep what was fitted at start-up; at shutdown, a request still in the engine (the drain cut
short by a second Ctrl+C, or no drain at all) is ended as "server shutting down", and the
trace keeps its row."""

from __future__ import annotations

import asyncio
import json
import time

import duckdb
from fixtures.serving import make_engine

from control.api.app import create_app
from control.serve.settings import ServeSettings
from engine.request import SamplingParams


def test_a_request_still_running_at_shutdown_is_ended_and_traced(tiny_loaded, tmp_path):
    trace = tmp_path / "trace.duckdb"
    engine, spy, settings = make_engine(tiny_loaded, delay_s=0.01, settings=ServeSettings(
        model="tiny", trace_db=str(trace)))
    app = create_app(settings, engine)
    long = SamplingParams(max_tokens=400, ignore_eos=True)

    async def scenario():
        async with app.router.lifespan_context(app):
            assert (await engine.call(lambda e: e.add_request("cut", [5, 6, 7], long))
                    ).accepted
            while "cut" not in spy.ran:
                await asyncio.sleep(0.01)

    asyncio.run(scenario())
    with duckdb.connect(str(trace), read_only=True) as con:
        rows = con.execute("SELECT outcome, finish_detail FROM requests"
                           " WHERE request_id = 'cut'").fetchall()
    assert rows == [("cancelled", "server shutting down")]


def test_the_run_settings_keep_the_budgets_fitted_at_start_up(tiny_loaded, tmp_path):
    """A what-if replay of the trace starts from the budgets this server fitted (no YAML
    has them): the run's settings hold them, with the step law they were fitted to."""
    trace = tmp_path / "trace.duckdb"
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", trace_db=str(trace)))
    fitted = dict(engine.parts.step_fit.fitted)
    assert fitted  # the tiny model's budgets are fitted to this machine
    app = create_app(settings, engine)

    async def scenario():
        async with app.router.lifespan_context(app):
            writer, deadline = app.state.serving.trace, time.monotonic() + 60
            while True:
                writer.sync()
                con = writer.cursor()
                row = con.execute("SELECT settings FROM runs").fetchone()
                con.close()
                noted = json.loads(row[0]) if row else {}
                if "step_law" in noted or time.monotonic() > deadline:
                    return noted
                await asyncio.sleep(0.02)

    noted = asyncio.run(scenario())
    assert noted.get("fitted_budgets") == fitted, noted
    assert noted["step_law"]
