"""The go-live checklist's spec: its errors name the item and the field, a spec file that
cannot be read or parsed is a usage error (exit 2, one line), a check's defaults fill the
parameters an item leaves out."""

from __future__ import annotations

import pytest

from control.checklist import ChecklistError, load_spec
from control.checklist.spec import parse_spec
from control.cli.main import main

ITEM = {"id": "x", "title": "X", "why": "because", "check": "watermarks_ordered"}


@pytest.mark.parametrize("item, message", [
    ({**ITEM, "check": "nope"}, "item 'x': check 'nope' is not a check; checks: alert_rules"),
    ({**ITEM, "params": {"gap": 0.1}}, "item 'x': params.gap is not a parameter of check"
     " 'watermarks_ordered' (it takes: min_gap)"),
    ({**ITEM, "params": {"min_gap": "big"}}, "item 'x': params.min_gap='big' must be a number"),
    ({**ITEM, "params": {"min_gap": True}}, "params.min_gap=True must be a number"),
    ({k: v for k, v in ITEM.items() if k != "why"}, "item 'x': why must be a non-empty string"),
    ({**ITEM, "thresholds": {}}, "item 'x': unknown key(s) ['thresholds']"),
    ({**ITEM, "check": "latency_under_slo", "params": {"ttft_s": "2s"}},
     "params.ttft_s='2s' must be a number"),
    ({**ITEM, "check": "latency_under_slo", "params": {"targets": "lane"}},
     "item 'x': params.targets='lane' must be one of lanes, fixed"),
])
def test_spec_errors_name_the_item_and_field(item, message):
    with pytest.raises(ValueError) as err:
        parse_spec({"sections": [{"id": "s", "title": "S", "items": [item]}]})
    assert message in str(err.value)


def test_spec_rejects_duplicate_ids_and_accepts_a_null_threshold():
    with pytest.raises(ValueError, match="item 'x': the id is used twice"):
        parse_spec({"sections": [{"id": "s", "title": "S", "items": [ITEM, ITEM]}]})
    spec = parse_spec({"sections": [{"id": "s", "title": "S", "items": [
        {**ITEM, "check": "latency_under_slo",
         "params": {"targets": "fixed", "ttft_s": 2.0, "tpot_s": None}}]}]})
    params = spec.sections[0].items[0].params
    assert params["tpot_s"] is None and params["ttft_s"] == 2.0
    assert params["percentiles"] == [95, 99]  # the check's default


@pytest.mark.parametrize("text, message", [
    ("sections: [", "is not valid YAML"), ("sections: []", "non-empty 'sections' list"),
    (None, "cannot be read")])
def test_bad_spec_files_are_usage_errors(tmp_path, capsys, text, message):
    path = tmp_path / "spec.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ChecklistError, match=message):
        load_spec(path)
    code = main(["checklist", "--trace-db", str(tmp_path / "t.duckdb"), "--spec", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_checks_parameter_is_read_from_the_first_item_using_it():
    """The evidence reads one value per check (the long-prompt length it gathers by): the
    first item's, as written; a check no item uses gives the default."""
    items = [{**ITEM, "id": "a", "params": {"min_gap": 0.05}},
             {**ITEM, "id": "b", "params": {"min_gap": 0.1}}]
    spec = parse_spec({"sections": [{"id": "s", "title": "S", "items": items}]})
    assert spec.param("watermarks_ordered", "min_gap") == 0.05
    assert spec.param("latency_under_slo", "ttft_s", 7) == 7
