"""The checklist spec (control/checklist/spec.py) where test_checklist_spec.py does not look:
a null only where a parameter takes one, an int as a number, blank text, a section without
items or with an unknown key, and the line a YAML error names."""

from __future__ import annotations

import pytest

from control.checklist import ChecklistError, load_spec
from control.checklist.spec import parse_spec

ITEM = {"id": "x", "title": "X", "why": "because", "check": "watermarks_ordered"}


def spec_of(*items: dict, **section: object) -> dict:
    return {"sections": [{"id": "s", "title": "S", "items": list(items), **section}]}


def test_a_null_is_refused_where_the_parameter_takes_none():
    """latency_under_slo's ttft_s may be null (no target); watermarks' min_gap may not."""
    with pytest.raises(ValueError, match=r"item 'x': params.min_gap=None must be a number"):
        parse_spec(spec_of({**ITEM, "params": {"min_gap": None}}))


def test_an_int_is_a_number_for_a_float_parameter_and_an_int_one():
    spec = parse_spec(spec_of({**ITEM, "params": {"min_gap": 0}},
                              {**ITEM, "id": "y", "check": "loadtest_present",
                               "params": {"min_requests": 50}}))
    first, second = spec.sections[0].items
    assert first.params == {"min_gap": 0} and second.params == {"min_requests": 50}


@pytest.mark.parametrize(("spec", "message"), [
    (spec_of({**ITEM, "title": "   "}), "item 'x': title must be a non-empty string"),
    (spec_of(ITEM, title=" \t"), "sections[0]: title must be a non-empty string"),
    (spec_of(), "section 's': items must be a non-empty list"),
    (spec_of(ITEM, itmes=[]), "sections[0]: unknown key(s) ['itmes']"),
])
def test_blank_text_an_empty_section_and_an_unknown_key_are_refused(spec, message):
    with pytest.raises(ValueError) as err:
        parse_spec(spec)
    assert message in str(err.value)


def test_a_yaml_error_names_the_line_and_column_of_the_bad_key(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: x\nsections:\n  - id: a\n    title: A\n   bad: 1\n")
    with pytest.raises(ChecklistError, match="is not valid YAML: .* at line 5, column 4$"):
        load_spec(path)
