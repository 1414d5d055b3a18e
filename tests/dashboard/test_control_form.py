"""The Control page's lanes table without Streamlit: each lane's SLO shows as two cells
(slo_ttft_s, slo_tpot_s) and an edit to them becomes the smallest merge patch, which the
server's own patch code applies as the operator meant (the other lanes' SLOs untouched)."""

from __future__ import annotations

import math

from dashboard.control_form import lane_rows, lanes_from_rows, merge_patch
from engine.config.patch import apply_patch, live_to_dict
from engine.config.schema import LaneSLO, LiveConfig, StaticConfig


def current() -> tuple[LiveConfig, dict]:
    live = LiveConfig()
    return live, live_to_dict(live)


def edited_patch(config: dict, edit) -> dict:
    rows = lane_rows(config["lanes"])
    edit(rows)
    return merge_patch(config, {"lanes": lanes_from_rows(rows, config["lanes"])})


def test_the_default_lanes_show_their_slo_targets_and_batch_none():
    _, config = current()
    rows = lane_rows(config["lanes"])
    assert rows["interactive"]["slo_ttft_s"] == 5.0 and rows["interactive"]["slo_tpot_s"] == 0.5
    assert rows["long_context"]["slo_ttft_s"] == 30.0
    assert rows["batch"]["slo_ttft_s"] is None and rows["batch"]["slo_tpot_s"] is None


def test_a_table_left_alone_patches_nothing_even_after_the_nan_round_trip():
    _, config = current()

    def as_pandas_gives_it(rows):  # an empty cell comes back as NaN
        rows["batch"]["slo_ttft_s"] = math.nan
        rows["batch"]["slo_tpot_s"] = math.nan

    assert edited_patch(config, as_pandas_gives_it) == {}


def test_an_edited_slo_is_applied_and_the_others_kept():
    live, config = current()

    def tighten(rows):
        rows["interactive"]["slo_ttft_s"] = 1  # typed as a whole number
        rows["batch"]["slo_ttft_s"] = 60.0

    patch = edited_patch(config, tighten)
    assert patch == {"lanes": {"interactive": {"slo": {"ttft_s": 1.0}},
                               "batch": {"slo": {"ttft_s": 60.0, "tpot_s": None}}}}
    new = apply_patch(live, StaticConfig(), patch)
    slos = {lane.name: lane.slo for lane in new.lanes}
    assert slos["interactive"] == LaneSLO(ttft_s=1.0, tpot_s=0.5)
    assert slos["long_context"] == LaneSLO(ttft_s=30.0, tpot_s=1.0)
    assert slos["batch"] == LaneSLO(ttft_s=60.0)


def test_emptying_a_lanes_slo_cells_gives_it_the_default():
    live, config = current()

    def clear(rows):
        rows["long_context"]["slo_ttft_s"] = None
        rows["long_context"]["slo_tpot_s"] = ""

    patch = edited_patch(config, clear)
    assert patch == {"lanes": {"long_context": {"slo": None}}}
    new = apply_patch(live, StaticConfig(), patch)
    lane = next(lane for lane in new.lanes if lane.name == "long_context")
    assert lane.slo is None and new.lane_slo(lane) == new.default_slo
