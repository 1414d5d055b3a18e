"""What an item's evidence says of the settings it read (control/checklist/registry.py's
helpers, through the checks): values to three figures, an unset one as "unset", and a
setting that could not be read named with where the config came from."""

from __future__ import annotations

from tests.control.checklist.evidence import good, result, set_evidence


def test_a_value_is_shown_to_three_figures():
    ev = good()
    set_evidence(ev, "config.kv_cache_high_watermark", 0.945)
    got = result(ev, "watermarks")
    assert got.status == "fail"
    assert "kv_cache_high_watermark 0.945, kv_cache_reject_watermark 0.95" in got.evidence


def test_a_limit_left_unset_reads_unset():
    ev = good()
    set_evidence(ev, "config.max_waiting_requests", None)
    got = result(ev, "limits_set")
    assert got.status == "fail" and "max_waiting_requests unset < 1" in got.evidence


def test_a_setting_not_known_names_where_the_config_came_from():
    ev = good()
    del ev.config["max_waiting_requests"]
    got = result(ev, "limits_set")
    assert got.status == "needs-evidence"
    assert got.evidence.startswith("not known: max_waiting_requests (GET /control/config,"
                                   " version 3); run with --url")
    ev.config_from = ""  # no config read: the reason it was not
    ev.missing["config"] = "the server answered 401: a token with the config scope is needed"
    assert "(the server answered 401: a token" in result(ev, "limits_set").evidence
