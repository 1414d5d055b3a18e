"""`batchpilot trace report`: a postmortem draft that names the config change behind a
latency regression, from a live server (--url) and from its file once stopped (--db).

The incident (tests/fixtures/incident.py): normal load, then max_num_seqs 128 -> 1 under load
(TTFT and queue delay go from ~10 ms to a few hundred), then a rollback. The report must
name version 2 with its diff, say that the rollback restored latency, and show during
worse than before.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time

import pytest
from fixtures.incident import BAD_REASON, WORKERS, scripted_incident
from fixtures.trace_data import fill_trace

from control.cli.main import main
from control.trace.report import JUDGED, pick_suspect

# judged on p99s of a few hundred requests: no suite beside it, only the other light
# quiet file (one in-process server each; tests/run_suites.py)
pytestmark = pytest.mark.quiet(light=True)


def report(*argv: str) -> tuple[int, str, str]:
    """`batchpilot trace ... report ...` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["trace", *argv])
        except SystemExit as done:  # argparse's usage errors
            code = done.code
    return code, out.getvalue(), err.getvalue()


def section(text: str, title: str) -> str:
    """The body of a '## title' section of the Markdown."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section {title!r} in:\n{text}"
    return match.group(1)


def without_source_line(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("_Drafted"))


@pytest.fixture(scope="module")
def incident(tiny_loaded, tmp_path_factory):
    """The incident, with its report asked of the live server (Markdown in a file, and the
    JSON), then of the file after the server stopped."""
    tmp = tmp_path_factory.mktemp("incident")
    with scripted_incident(tiny_loaded, tmp) as inc:
        live_code, live_out, live_err = report("--url", inc.url, "report", "--out",
                                               str(tmp / "live.md"))
        assert live_code == 0, live_err
        code, out, err = report("--url", inc.url, "report", "--json")
        assert code == 0, err
        inc.live_data = json.loads(out)
        inc.stop()
        assert report("--db", inc.trace_db, "report", "--out", str(tmp / "file.md"))[0] == 0
    inc.live_md = (tmp / "live.md").read_text()
    inc.file_md = (tmp / "file.md").read_text()
    inc.live_says = live_out
    return inc


def test_the_report_names_the_bad_change_and_its_rollback(incident):
    cause = section(incident.live_md, "Suspected cause")
    assert f"**Config version {incident.bad_version}**" in cause
    assert "max_num_seqs: 128 -> 1" in cause
    assert "max_num_batched_tokens: 8192 -> 16" in cause
    assert f'reason: "{BAD_REASON}"' in cause and "`local`" in cause
    assert f"**Restored** by config version {incident.rollback_version}" in cause
    assert f"rollback:{incident.good_version}" in cause
    suspect = incident.live_data["suspect"]
    assert suspect["version"] == incident.bad_version
    assert suspect["time"] == pytest.approx(incident.bad_time, abs=1e-3)
    assert suspect["restored_by"]["version"] == incident.rollback_version
    assert incident.bad_diff == {"max_num_batched_tokens": [8192, 16], "max_num_seqs": [128, 1]}
    assert f"suspected cause: config version {incident.bad_version}" in incident.live_says
    # the suspected cause comes first, before the evidence
    assert incident.live_md.index("## Suspected cause") < incident.live_md.index("## Summary")


def test_latency_is_worse_during_than_before_and_after(incident):
    phases = incident.live_data["phases"]
    before, during, after = (phases[p]["all"] for p in ("before", "during", "after"))
    for stats in (before, during, after):
        assert stats["ttft_s_n"] >= 10 and stats["queue_delay_s_n"] >= 10
    assert during["ttft_s_p99"] > 2 * before["ttft_s_p99"]
    assert during["ttft_s_p50"] > 2 * before["ttft_s_p50"]
    assert during["queue_delay_s_p99"] > before["queue_delay_s_p99"] + 0.05
    assert after["ttft_s_p99"] < during["ttft_s_p99"] / 2
    # cohorts go by the server's arrival time, phases by the client's send time: a request
    # sent as a phase ended may count in the next one
    for stats, phase in ((before, 0), (during, 1), (after, 2)):
        sent = len(incident.phases[phase].request_ids)
        rejected = incident.rejected if phase == 1 else 0
        assert abs(stats["requests"] - rejected - sent) <= WORKERS, (phase, stats, sent)
    lat = section(incident.live_md, "Latency by lane")
    header = next(line for line in lat.splitlines() if line.startswith("|  |"))
    assert header.split("|")[2:5] == [" before ", " during ", " after "]
    for metric in ("TTFT", "TPOT", "E2E", "queue delay"):
        for q in ("n", "p50", "p95", "p99"):
            assert f"| {metric} {q} |" in lat


def test_timeline_lists_every_change_with_its_effect(incident):
    timeline = section(incident.live_md, "Timeline of config changes")
    rows = [line for line in timeline.splitlines() if re.match(r"\| \d\d:", line)]
    versions = [int(r.split("|")[2]) for r in rows]
    assert versions == [incident.good_version, incident.bad_version,
                        incident.rollback_version]
    startup, bad, back = rows
    assert "startup" in startup and "(starting config)" in startup
    assert "api" in bad and BAD_REASON in bad and "max_num_seqs: 128 -> 1" in bad
    assert "**worse**" in bad and "TTFT p99" in bad
    assert f"rollback:{incident.good_version}" in back and "restore batching" in back
    assert "max_num_seqs: 1 -> 128" in back and "**better**" in back


def test_rejections_and_slowest_requests(incident):
    bursts = section(incident.live_md, "Rejection bursts")
    assert f"| {incident.rejected} | too_long {incident.rejected} |" in bursts
    slowest = section(incident.live_md, "Slowest requests")
    assert "queued mostly for max_num_seqs" in slowest
    ids = re.findall(r"^\| (\S+) \| ", slowest, re.M)[1:]  # after the header's "request"
    # queued under the bad config: sent in phase 2, or in flight when it came
    phase2 = set(incident.phases[1].request_ids)
    assert len(ids) == 10 and len(set(ids) - phase2) <= WORKERS
    assert set(ids) <= phase2 | set(incident.phases[0].request_ids)
    assert "KV usage crossed no watermark" in section(incident.live_md,
                                                      "KV watermark crossings")


def test_the_file_gives_the_same_report_as_the_server(incident):
    assert without_source_line(incident.file_md) == without_source_line(incident.live_md)
    assert f"from `--db {incident.trace_db}`" in incident.file_md
    assert f"from `--url {incident.url}`" in incident.live_md


def test_windows_without_a_cause_or_without_data_say_so(incident):
    db = incident.trace_db
    normal = incident.phases[0]
    code, out, _ = report("--db", db, "report", "--since", str(normal.start),
                          "--until", str(normal.end - 0.01))
    assert code == 0
    assert "**No config change in this window**" in section(out, "Suspected cause")
    assert "| before |" not in out and "| window |" in out
    # only the rollback in the window: it made latency better, so nothing explains a regression
    code, out, _ = report("--db", db, "report", "--since", str(incident.bad_time + 0.5))
    assert code == 0
    assert "**No config change explains a latency regression**: 1 change(s)" in out
    assert "**better**" in section(out, "Timeline of config changes")
    future = time.time() + 3600
    code, out, _ = report("--db", db, "report", "--since", str(future))
    assert code == 0
    assert "# Postmortem draft: no steps recorded in this window" in out
    for title, says in (("Timeline of config changes", "No config changes in this window"),
                        ("Latency by lane", "No requests arrived in this window"),
                        ("Rejection bursts", "No requests were rejected"),
                        ("Slowest requests", "No requests ended in this window")):
        assert says in section(out, title), title


def test_watermark_crossings_from_a_simulated_trace(tmp_path):
    db = str(tmp_path / "sim.duckdb")
    fill_trace(db).stop()  # 40 KV blocks: usage crosses the watermarks; one change (4 -> 3)
    code, out, _ = report("--db", db, "report")
    assert code == 0
    kv = section(out, "KV watermark crossings")
    assert "above high watermark" in kv and "above reject watermark" in kv
    assert "| 88.0% / 95.0% |" in kv
    assert "too few requests to judge" in section(out, "Timeline of config changes")
    assert "**No config change explains" in section(out, "Suspected cause")


def test_bad_arguments_are_usage_errors(tmp_path):
    db = str(tmp_path / "sim.duckdb")
    fill_trace(db).stop()
    (tmp_path / "a-file").write_text("")
    cases = [(["--db", db, "report", "--since", "yesterday-ish"], "not understood"),
             (["--db", db, "report", "--since", "20", "--until", "10"], "--since"),
             (["--db", db, "report", "--compare-s", "0"], "--compare-s"),
             (["--db", db, "report", "--out", str(tmp_path / "a-file" / "pm.md")],
              "--out"),  # a folder that cannot be made
             (["--db", db, "--url", "http://127.0.0.1:9", "report"], "not both"),
             (["--db", str(tmp_path / "missing.duckdb"), "report"], "does not exist")]
    for argv, says in cases:
        code, out, err = report(*argv)
        assert code == 2, (argv, out, err)
        assert says in err and not out, (argv, err)


def test_the_report_makes_its_evidence_folder(tmp_path):
    """The runbooks write `--out "$EVIDENCE_DIR/postmortem.md"`: a folder not made yet."""
    db = str(tmp_path / "sim.duckdb")
    fill_trace(db).stop()
    target = tmp_path / "evidence" / "incident-42" / "postmortem.md"
    code, _, err = report("--db", db, "report", "--out", str(target))
    assert code == 0 and target.read_text().startswith("#"), err


def test_the_suspect_is_the_largest_growth_and_a_stall_does_not_hide_a_fix():
    def change(version, verdict, before=0.02, after=0.02, n=50):
        stats = {m: v for m in JUDGED for v in [None]}
        judged = {"version": version, "time": float(version), "verdict": verdict,
                  "before": {**stats, "ttft_s_n": n, "ttft_s_p99": before},
                  "after": {**stats, "ttft_s_n": n, "ttft_s_p99": after}}
        if verdict == "worse":
            judged["worse"] = {"ttft_s_p99": [before, after]}
        return judged
    changes = [change(2, "worse", 0.02, 0.2), change(3, "worse", 0.2, 1.5),
               change(4, "no clear change", 1.5, 1.4, n=5),  # too few to count as a fix
               change(5, "better", 1.4, 0.9)]  # 0.7 s of the 1.3 s growth left: not back
    assert pick_suspect(changes) == {"version": 3, "time": 3.0, "growth_s": pytest.approx(1.3),
                                     "restored_by": None, "also_worse": [2]}
    changes[3]["after"]["ttft_s_p99"] = 0.6  # 0.4 s left: a stall, within half the growth
    assert pick_suspect(changes)["restored_by"] == {"version": 5, "time": 5.0}
    assert pick_suspect([change(2, "better"), change(3, "no clear change")]) is None


def test_audit_rows_are_listed_in_the_timeline_but_never_judged():
    """A law refit, a prediction or a fleet's scale event is a config_changes row that is
    not a config version: the timeline shows it, says it was not judged, and does not
    count it among the changes left unjudged."""
    from control.trace.report_format import _timeline

    version = {"time": 100.0, "version": 2, "source": "api", "actor": "ops", "note": "",
               "change": {"max_num_seqs": [64, 8]}, "verdict": "no clear change"}
    refit = {"time": 110.0, "version": 2, "source": "step_law_refit", "actor": "scheduler",
             "note": "step law refitted", "change": {"step_law": [{"fixed_ms": 1},
                                                                {"fixed_ms": 2}]}}
    scale = {**refit, "time": 120.0, "source": "autoscale_scale_up", "actor": "autoscaler",
             "change": {"replica-1": ["off", "starting"]}}
    text = _timeline({"changes": [version, refit, scale], "judged": 1, "compare_s": 30.0})
    assert text.count("an audit row, not a config change: not judged") == 2, text
    assert "Only the first" not in text, text
