"""`make mutants` bugs in the fleet's replica loads (stats long poll, slots), the local
fleet's handles and the checklist's registry and results (pass of 2026-12-07); each has a
test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

FLEET_CHECKLIST_MUTANTS: list[Mutant] = [
    Mutant("loads-excluded-routed", "control/fleet/loads.py",
           "self.healthy and self.routable and in_service", "self.healthy and in_service",
           (CTL + "fleet/test_fleet_restart.py::test_one_replica_at_a_time_out_of_routing_until"
                  "_back_new_and_converged",),
           "a replica a rolling restart took out still gets new requests"),
    Mutant("loads-late-one-more", "control/fleet/loads.py",
           "view.late_polls >= MAX_LATE_POLLS", "view.late_polls > MAX_LATE_POLLS",
           (CTL + "fleet/test_fleet_router.py::test_a_busy_replica_whose_polls_come_late_stays"
                  "_up_for_a_few_polls",),
           "a replica that stopped answering is routed to for one more late poll"),
    Mutant("loads-answer-keeps-late-count", "control/fleet/loads.py",
           "        view = self.views[replica_id]\n        view.late_polls = 0\n",
           "        view = self.views[replica_id]\n",
           (CTL + "fleet/test_fleet_router.py::test_a_busy_replica_whose_polls_come_late_stays"
                  "_up_for_a_few_polls",),
           "a busy replica's late polls add up across answers: it is marked down though it "
           "answers"),
    Mutant("loads-failed-call-stays-up", "control/fleet/loads.py",
           '            log.warning("replica %d marked down: %s", replica_id, why)\n        '
           "view.healthy = False",
           '            log.warning("replica %d marked down: %s", replica_id, why)',
           (CTL + "fleet/test_fleet_router.py::test_load_table_marks_a_failed_replica_down_until"
                  "_it_polls_ready",),
           "a replica whose call failed (it died) keeps getting requests until the next poll"),
    Mutant("loads-stale-poll-overrides-push", "control/fleet/loads.py",
           "asked_at < view.pushed[0]", "asked_at > view.pushed[0]",
           (CTL + "fleet/test_fleet_control_plane.py::test_a_change_is_versioned_pushed_to_every"
                  "_replica_and_converges",),
           "a poll answered before a push reads the old fleet version: the push looks "
           "unconverged"),
    Mutant("loads-done-not-counted", "control/fleet/loads.py",
           "self.views[replica_id].inflight -= 1", "pass",
           (CTL + "fleet/test_fleet_scaling_local.py::test_a_burst_starts_a_replica_and_an_idle"
                  "_spell_drains_then_stops_it",),
           "finished requests still count in flight: the router (and autoscaling) sees a busy "
           "replica forever"),
    Mutant("loads-version-change-waits", "control/fleet/loads.py",
           '"inflight", "fleet_version")', '"inflight")',
           (CTL + "fleet/test_fleet_stats_poll.py::test_a_pushed_fleet_version_ends_the_wait_at"
                  "_once",),
           "a pushed fleet version waits out the idle long poll: config changes converge a "
           "second late"),
    Mutant("loads-long-poll-timeout-short", "control/fleet/loads.py",
           "fetch(since, wait_s), wait_s + timeout_s)", "fetch(since, wait_s), timeout_s)",
           (CTL + "fleet/test_fleet_stats_poll.py::test_a_long_poll_answered_at_the_end_of_its"
                  "_wait_is_not_late",),
           "an idle replica holding its long poll reads as late: the idle fleet is marked down "
           "every few polls"),
    Mutant("loads-since-while-down", "control/fleet/loads.py",
           "if view.healthy and view.polled else None", "if view.polled else None",
           (CTL + "fleet/test_fleet_stats_poll.py::test_a_poll_waits_only_past_a_healthy_answer",),
           "a replica that is down is long-polled: it comes back up only after the wait"),
    Mutant("loads-late-is-down", "control/fleet/loads.py",
           "stats, late = None, True", "stats, late = None, False",
           (CTL + "fleet/test_fleet_router.py::test_poll_forever_counts_a_slow_answer_as_late"
                  "_not_as_down",),
           "one slow poll marks a busy replica down: 503 no replica is healthy under load"),
    Mutant("loads-inactive-stays-up", "control/fleet/loads.py",
           "            table.polled(replica_id, None)\n            await asyncio.sleep(poll_s)",
           "            await asyncio.sleep(poll_s)",
           (CTL + "fleet/test_fleet_stats_poll.py::test_a_slot_autoscaling_has_emptied_reads_as"
                  "_down_without_being_asked",),
           "a slot autoscaling emptied keeps its last healthy reading and is routed to"),
    Mutant("local-cancel-noop", "control/fleet/local.py",
           "asyncio.ensure_future(self._stream.aclose())  # type: ignore[attr-defined]", "pass",
           (CTL + "fleet/test_fleet_local_handles.py::test_cancelling_a_call_closes_the_replicas"
                  "_stream",),
           "a client leaving the local fleet leaves its replica generating for nobody"),
    Mutant("local-drain-no-grace", "control/fleet/local.py",
           "self.replica.drain(grace_s)", "self.replica.drain(0.0)",
           (CTL + "fleet/test_fleet_local_handles.py::test_a_drain_reaches_the_replica_with_its"
                  "_grace",),
           "draining the local fleet aborts in-flight requests at once, ignoring the grace"),
    Mutant("local-kwargs-dropped", "control/fleet/local.py",
           "_result(method(*args, **kwargs))", "_result(method(*args))",
           (CTL + "fleet/test_fleet_control_plane.py::test_a_change_is_versioned_pushed_to_every"
                  "_replica_and_converges",),
           "control calls through the local fleet lose their keyword arguments (actor, reason)"),
    Mutant("local-wait-healthy-no-deadline", "control/fleet/local.py",
           "if loop.time() > deadline:", "if False:",
           (CTL + "fleet/test_fleet_local_handles.py::test_waiting_for_a_fleet_that_never_polls"
                  "_healthy_gives_up",),
           "a local fleet whose replicas never come up hangs its starter forever"),
    Mutant("reg-static-ignored", "control/checklist/registry.py",
           'node: Any = ev.static if key.startswith("static.") else ev.config',
           "node: Any = ev.config",
           (CTL + "checklist/test_checklist.py::test_a_deployment_that_did_everything_passes"
                  "_every_item",),
           "checks on static settings (static.num_kv_blocks) read the live config: they need "
           "evidence or misjudge"),
    Mutant("reg-missing-as-none", "control/checklist/registry.py",
           "node.get(part, _MISSING) if isinstance(node, dict) else _MISSING",
           "node.get(part) if isinstance(node, dict) else _MISSING",
           (CTL + "checklist/test_checklist.py::test_missing_evidence_is_needs_evidence_saying"
                  "_what_is_missing",),
           "a setting the evidence lacks reads as unset: the item fails instead of asking for "
           "evidence"),
    Mutant("reg-fmt-two-digits", "control/checklist/registry.py",
           'return f"{value:.3g}" if abs(value) < 1000',
           'return f"{value:.2g}" if abs(value) < 1000',
           (CTL + "checklist/test_checklist_evidence_text.py::test_a_value_is_shown_to_three"
                  "_figures",),
           "checklist evidence rounds to 2 figures: a watermark of 0.945 shows as 0.94"),
    Mutant("reg-fmt-none", "control/checklist/registry.py",
           'return "unset"', 'return "None"',
           (CTL + "checklist/test_checklist_evidence_text.py::test_a_limit_left_unset_reads"
                  "_unset",),
           "an unset limit shows as 'None' in the checklist evidence"),
    Mutant("reg-missing-where-lost", "control/checklist/registry.py",
           'where = ev.config_from or ev.missing.get("config", "no config was read")',
           'where = "no config was read"',
           (CTL + "checklist/test_checklist_evidence_text.py::test_a_setting_not_known_names"
                  "_where_the_config_came_from",),
           "a checklist item that needs evidence no longer says where the config came from (or "
           "why none was read)"),
    Mutant("result-needs-is-fail", "control/checklist/result.py",
           "return Verdict(NEEDS, evidence, details)", "return Verdict(FAIL, evidence, details)",
           (CTL + "checklist/test_change_predicted.py::test_without_a_trace_it_needs_evidence",),
           "items that need evidence report as failed: a deployment reads NOT ready for missing "
           "data"),
    Mutant("result-usage-code-1", "control/checklist/result.py",
           "def __init__(self, message: str, code: int = 2):",
           "def __init__(self, message: str, code: int = 1):",
           (CTL + "checklist/test_checklist_cli.py::test_cli_usage_errors_are_one_line",),
           "a bad spec or unreachable server exits 1 like a failing item, not 2"),
    Mutant("result-needs-not-counted", "control/checklist/result.py",
           "STATUSES = (PASS, FAIL, NEEDS)", "STATUSES = (PASS, FAIL)",
           (CTL + "checklist/test_checklist.py::test_markdown_and_text_reports",),
           "the summary leaves needs-evidence items out of its counts"),
    Mutant("result-why-dropped", "control/checklist/result.py",
           "        return asdict(self)",
           '        return {k: v for k, v in asdict(self).items() if k != "why"}',
           (CTL + "checklist/test_checklist_report.py::test_the_json_report_says_why_each_item"
                  "_matters",),
           "the JSON checklist report drops why each item matters"),
]
