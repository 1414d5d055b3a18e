"""The structured-output limits at their bounds (control/api/structured.py): a schema of
exactly max_schema_bytes and a pattern repeat of exactly MAX_PATTERN_REPEAT are taken, one
more is a 400 (the other tests send far more than either)."""

from __future__ import annotations

import json

import pytest

from control.api.errors import APIError
from control.api.structured import (
    MAX_PATTERN_REPEAT,
    check_schema_patterns,
    check_schema_size,
)
from engine.structured.spec import StructuredOutput


def spec(schema: dict) -> StructuredOutput:
    return StructuredOutput("json_schema", json.dumps(schema, separators=(",", ":")))


def test_a_schema_of_exactly_max_schema_bytes_passes_and_one_byte_more_is_refused():
    s = spec({"enum": ["a"]})
    size = len(s.schema.encode())
    check_schema_size(s, "guided_json", size)
    with pytest.raises(APIError, match=f"the schema is {size} bytes") as info:
        check_schema_size(s, "guided_json", size - 1)
    assert info.value.status == 400


@pytest.mark.parametrize("form", ["a{%d}", "a{1,%d}", "(ab){%d,}"])
def test_a_repeat_of_exactly_the_bound_passes_and_one_more_is_refused(form):
    def schema(n: int) -> StructuredOutput:
        return spec({"type": "string", "pattern": form % n})

    check_schema_patterns(schema(MAX_PATTERN_REPEAT), "guided_json")
    with pytest.raises(APIError, match=f"{MAX_PATTERN_REPEAT + 1} times"):
        check_schema_patterns(schema(MAX_PATTERN_REPEAT + 1), "guided_json")
