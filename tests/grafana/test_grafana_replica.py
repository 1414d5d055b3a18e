"""The boards read a fleet (`batchpilot fleet`: every series labelled replica="<id>") and a
single server (no replica label) alike: a `replica` variable, multi-select with All = `.*`,
filters every batchpilot series in every panel and annotation."""

from __future__ import annotations

import json
import re

import pytest
from fixtures.grafana import BOARDS, board_queries

# a metric name and its label matchers: batchpilot_xxx{...}
SELECTOR_RE = re.compile(r"(batchpilot_\w+)\{([^}]*)\}")


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.stem)
def test_every_panel_query_filters_by_the_replica_variable(path):
    board = json.loads(path.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    replica = variables["replica"]
    assert replica["multi"] and replica["includeAll"], replica
    # NOTE: ".*" also matches a series without the label (a single server's)
    assert replica["allValue"] == ".*"
    assert replica["query"] == "label_values(batchpilot_engine_steps_total, replica)"
    selectors = 0
    for where, expr in board_queries(board):
        if where.startswith("variable") or "ALERTS{" in expr:
            continue
        found = SELECTOR_RE.findall(expr)
        assert found, (where, expr)  # every query reads batchpilot series through a selector
        for metric, matchers in found:
            assert 'replica=~"$replica"' in matchers, (where, metric, matchers)
            selectors += 1
        bare = re.findall(r"batchpilot_\w+(?![\w{])", expr)
        assert not bare, (where, bare)  # no series read without the filter
    assert selectors >= 20  # the boards' queries, not an empty list
