"""`make mutants` bugs in where trace answers come from (a file, a fleet's files, a server's
read API), the trace schema, the times operators type, the span process, the what-if's audit
rows and the step-time law's least-squares fit (pass of 2026-12-07); each has a test that
fails on it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, SEC, Mutant

_CLI = CTL + "trace/test_trace_cli.py::"
_FLEET = CTL + "trace/test_trace_fleet.py::"
_URL = CTL + "trace/test_trace_url_source.py::"
_TIME = CTL + "trace/test_timeparse.py::"
_SPANS = CTL + "otel/test_span_process.py::"
_AUDIT = CTL + "whatif/test_whatif_audit.py::"
_CAL = CTL + "whatif/test_whatif_calibrate.py::"

TRACE_SOURCES_MUTANTS: list[Mutant] = [
    # ---- control/trace/sources.py: a trace file ---------------------------------------
    Mutant("tsrc-file-query-error-exit-1", "control/trace/sources.py",
           "            data = QUESTIONS[question][0](con, **params)\n"
           "        except ValueError as exc:\n            raise TraceError(str(exc), 2)",
           "            data = QUESTIONS[question][0](con, **params)\n"
           "        except ValueError as exc:\n            raise TraceError(str(exc), 1)",
           (_CLI + "test_bad_values_are_usage_errors_naming_what_is_wrong",),
           "`trace --db F slow --limit 0` exits 1 (try again) instead of 2 (fix the command)"),
    Mutant("tsrc-file-unknown-request-prints-null", "control/trace/sources.py",
           "        finally:\n            con.close()\n        if data is None:",
           "        finally:\n            con.close()\n        if False:",
           (_CLI + "test_an_unknown_request_exits_1_from_either_source",),
           "`trace --db F request NOPE` prints an empty timeline and exits 0"),
    Mutant("tsrc-file-open-error-exit-1", "control/trace/sources.py",
           "            return open_read_only(self.path)\n        except ValueError as exc:\n"
           "            raise TraceError(str(exc), 2)",
           "            return open_read_only(self.path)\n        except ValueError as exc:\n"
           "            raise TraceError(str(exc), 1)",
           (_CLI + "test_the_source_must_be_exactly_one_of_db_or_url",),
           "a missing or foreign --db file exits 1, as if retrying could help"),
    # ---- a fleet's files -------------------------------------------------------------
    Mutant("tsrc-fleet-replica-ignored", "control/trace/sources.py",
           "return expand(self.path, self.replica)", "return expand(self.path, None)",
           (_FLEET + "test_replica_reads_one_file",),
           "`trace --db 'DIR/*.duckdb' --replica 1` reads every replica's rows as replica 1's"),
    Mutant("tsrc-single-file-replica-ignored", "control/trace/sources.py",
           "if is_pattern(db) or replica is not None:", "if is_pattern(db):",
           (_FLEET + "test_replica_reads_one_file",),
           "`--db replica-0.duckdb --replica 1` answers from replica 0's file without a word"),
    Mutant("tsrc-fleet-unknown-request-prints-null", "control/trace/sources.py",
           "                con.close()\n        if data is None:",
           "                con.close()\n        if False:",
           (_FLEET + "test_rows_name_their_replica_and_merge_in_order",),
           "`trace --db 'DIR/*.duckdb' request NOPE` prints null and exits 0"),
    # ---- a server's read API ---------------------------------------------------------
    Mutant("tsrc-url-replica-never-checked", "control/trace/sources.py",
           "        self._checked = replica is None", "        self._checked = True",
           (_URL + "test_a_replica_named_at_a_single_server_is_a_usage_error",),
           "`trace --url SERVER --replica 1` on one server (which ignores the header) answers"
           " for the whole server as if for replica 1"),
    Mutant("tsrc-url-unknown-replica-accepted", "control/trace/sources.py",
           "        if self.replica not in ids:", "        if False:",
           (_URL + "test_an_unknown_replica_is_a_usage_error_naming_the_fleets",),
           "`--replica 7` at a fleet of two is sent on; the ingress's answer, not the"
           " fleet's replica list, is what the operator sees"),
    Mutant("tsrc-url-fleet-none-ready-refused", "control/trace/sources.py",
           "ready = exc.body if exc.status == 503 else None", "ready = None",
           (_URL + "test_one_replica_of_a_fleet_with_none_ready_can_still_be_read",),
           "a fleet whose replicas are all down cannot be read replica by replica: the trace"
           " of what went wrong is out of reach when it is needed"),
    Mutant("tsrc-url-replica-header-dropped", "control/trace/sources.py",
           "headers = {REPLICA_HEADER: self.replica} if self.replica is not None else {}",
           "headers = {}",
           (_URL + "test_a_replica_of_a_fleet_is_asked_by_its_header",),
           "`--replica 1` at a fleet ingress reads every replica merged, labelled as one"),
    Mutant("tsrc-url-token-not-sent", "control/trace/sources.py",
           "        if self.token:\n            headers", "        if False:\n            headers",
           (SEC + "test_tenant_tokens.py::test_batchpilot_trace_with_a_bound_token_shows_its"
            "_tenant_only",),
           "`trace --url` never sends $BATCHPILOT_TOKEN: every read of a server with tokens"
           " is a 401"),
    Mutant("tsrc-url-401-hint-inverted", "control/trace/sources.py",
           "if exc.status == 401 and not self.token", "if exc.status == 401 and self.token",
           (_URL + "test_a_401_without_a_token_says_how_to_send_one",),
           "a 401 without a token does not say to set $BATCHPILOT_TOKEN; one with a wrong"
           " token wrongly says none was sent"),
    Mutant("tsrc-url-400-exit-1", "control/trace/sources.py",
           "2 if exc.status == 400 else 1", "1",
           (_CLI + "test_bad_values_are_usage_errors_naming_what_is_wrong",),
           "a server's 400 (a bad --limit) exits 1 (retry) instead of 2 (fix the command)"),
    Mutant("tsrc-url-unreachable-exit-2", "control/trace/sources.py",
           "            if exc.status is None:\n                raise TraceError(exc.message, 1)"
           " from None\n            hint",
           "            if exc.status is None:\n                raise TraceError(exc.message, 2)"
           " from None\n            hint",
           (_CLI + "test_a_server_that_cannot_be_reached_exits_1_naming_the_url",),
           "an unreachable server exits 2 (usage): a script's retry-on-1 gives up"),
    Mutant("tsrc-url-request-id-unquoted", "control/trace/sources.py",
           "route.format(request_id=urllib.parse.quote(params.pop(\"request_id\"),\n"
           "                                                               safe=\"\"))",
           "route.format(request_id=params.pop(\"request_id\"))",
           (_CLI + "test_an_unknown_request_exits_1_from_either_source",),
           "`trace --url U request 'r1#x'` shows request r1's timeline: the id's '#' or '?'"
           " cuts the path"),
    Mutant("tsrc-url-none-params-sent", "control/trace/sources.py",
           "for k, v in params.items() if v is not None})", "for k, v in params.items()})",
           (_CLI + "test_db_and_url_give_the_same_json",),
           "`trace --url` sends since=None: every read without a window is a 400"),
    Mutant("tsrc-url-trailing-slash-kept", "control/trace/sources.py",
           "self.url = url.rstrip(\"/\")", "self.url = url",
           (_URL + "test_a_url_with_a_trailing_slash_reads_the_same",),
           "`--url http://host:8000/` asks //v1/trace/...: a 404 for every question"),
    Mutant("http-json-error-body-dropped", "control/cli/http_json.py",
           "return body, message if isinstance(message, str) else str(exc.reason)",
           "return {}, message if isinstance(message, str) else str(exc.reason)",
           (_URL + "test_one_replica_of_a_fleet_with_none_ready_can_still_be_read",),
           "a fleet's 503 /readyz loses its replica list: `trace --url FLEET --replica 0`"
           " says 'not a fleet ingress' while no replica is ready (the bug found in this"
           " pass)"),
    # ---- control/trace/schema.py -------------------------------------------------------
    Mutant("schema-no-upgrade-of-old-files", "control/trace/schema.py",
           "        for name, kind in table.columns:\n            con.execute",
           "        for name, kind in ():\n            con.execute",
           (CTL + "fleet/test_fleet_versions_local.py::test_a_trace_from_before_fleet_version"
            "_opens_and_gains_the_column",),
           "a trace file from an older batchpilot lacks the new columns: the writer's insert"
           " and every query naming them fail"),
    Mutant("schema-times-as-float32", "control/trace/schema.py",
           "\"float\": (\"DOUBLE\", pa.float64()),", "\"float\": (\"FLOAT\", pa.float32()),",
           (_CLI + "test_steps_around_a_moment_and_in_a_window",),
           "epoch seconds stored as float32 (2 min resolution): every time in the trace is"
           " wrong by up to a minute"),
    Mutant("schema-requests-retained-by-arrival", "control/trace/schema.py",
           "    (\"resent\", \"bool\"),\n), \"finished_time\")",
           "    (\"resent\", \"bool\"),\n), \"arrival_time\")",
           (CTL + "trace/test_trace_writer.py::test_retention_by_age_and_by_size",),
           "retention deletes by arrival time: a long request finished inside the window"
           " disappears with the old ones"),
    Mutant("schema-decode-counts-no-token", "control/trace/schema.py",
           "'decode' AS phase, 1::BIGINT AS tokens", "'decode' AS phase, 0::BIGINT AS tokens",
           (_CLI + "test_step_requests_tokens_add_up_as_the_docs_say",),
           "step_requests says a decode computed no token: per-request token sums are wrong"),
    Mutant("schema-step-requests-across-runs", "control/trace/schema.py",
           "FROM ran JOIN request_ids USING (run_id, seq)",
           "FROM ran JOIN request_ids USING (seq)",
           (CTL + "trace/test_trace_writer.py::test_after_a_restart_each_request_keeps_its"
            "_own_steps",),
           "a file with two runs (a restart) gives a request the steps of another run's"
           " request of the same number"),
    Mutant("schema-create-not-idempotent", "control/trace/schema.py",
           "CREATE TABLE IF NOT EXISTS {self.name}", "CREATE TABLE {self.name}",
           (CTL + "trace/test_trace_writer.py::test_after_a_restart_each_request_keeps_its"
            "_own_steps",),
           "a server restarted on its trace file cannot open it"),
    # ---- control/trace/timeparse.py ----------------------------------------------------
    Mutant("timeparse-minutes-as-seconds", "control/trace/timeparse.py",
           "\"m\": 60.0", "\"m\": 1.0",
           (_TIME + "test_relative_times_count_back_from_now_in_their_unit",),
           "`--since -15m` reads the last 15 seconds"),
    Mutant("timeparse-relative-into-the-future", "control/trace/timeparse.py",
           "return now - float(match.group(1))", "return now + float(match.group(1))",
           (_CLI + "test_bad_values_are_usage_errors_naming_what_is_wrong",),
           "`--since -1h` is an hour from now: every window is empty"),
    Mutant("timeparse-no-fractional-relative", "control/trace/timeparse.py",
           "r\"^-(\\d+(?:\\.\\d+)?)([smhd])$\"", "r\"^-(\\d+)([smhd])$\"",
           (_TIME + "test_relative_times_count_back_from_now_in_their_unit",),
           "`--until -1.5h` (the CLI's own example) is refused as not understood"),
    Mutant("timeparse-nan-string-accepted", "control/trace/timeparse.py",
           "        return _finite(number, text)", "        return number",
           (_CLI + "test_no_time_and_no_limit_out_of_range_reaches_a_query",),
           "`?since=nan` reaches the query: a window bounded by nan silently matches nothing"),
    Mutant("timeparse-nan-number-accepted", "control/trace/timeparse.py",
           "        return _finite(float(text), text)", "        return float(text)",
           (CTL + "whatif/test_whatif_api.py::test_bad_input_is_400_naming_the_field",),
           "POST /v1/whatif {\"since\": NaN} replays an empty window instead of a 400"),
    Mutant("timeparse-one-digit-hour-refused", "control/trace/timeparse.py",
           "r\"^\\d{1,2}:\\d{2}", "r\"^\\d{2}:\\d{2}",
           (_TIME + "test_a_clock_time_is_today_in_local_time",),
           "`--since 9:30` is refused: only 09:30 is understood"),
    Mutant("timeparse-one-digit-hour-not-padded", "control/trace/timeparse.py",
           "wall = value if value.index(\":\") == 2 else \"0\" + value",
           "wall = value",
           (_TIME + "test_a_clock_time_is_today_in_local_time",),
           "`--since 9:30` matches the clock form but ISO 8601 refuses it: not understood"
           " (the bug found in this pass)"),
    Mutant("timeparse-empty-is-an-error", "control/trace/timeparse.py",
           "    if text is None or text == \"\":", "    if text is None:",
           (_TIME + "test_no_time_is_none_and_a_bad_one_says_what_is_accepted",),
           "`?since=` (an empty form field, the dashboard's blank box) is a 400, not all time"),
    Mutant("timeparse-now-not-understood", "control/trace/timeparse.py",
           "    if value == \"now\":\n        return now", "    if value == \"nil\":\n"
           "        return now",
           (_CLI + "test_no_time_and_no_limit_out_of_range_reaches_a_query",),
           "`--until now` (the documented form) is refused"),
    Mutant("timeparse-clock-today-in-utc", "control/trace/timeparse.py",
           "today = datetime.fromtimestamp(now).date()",
           "today = datetime.fromtimestamp(now - 86400).date()",
           (_TIME + "test_a_clock_time_is_today_in_local_time",),
           "`--since 14:02` is yesterday's 14:02: the window holds a day too much"),
    # ---- control/otel/span_process.py --------------------------------------------------
    Mutant("spanproc-lost-batch-counts-one", "control/otel/span_process.py",
           "self._lost += len(kept)", "self._lost += 1",
           (_SPANS + "test_a_dead_span_process_costs_counted_drops_and_never_blocks",),
           "a dead span process's dropped batch counts one failure however many requests"),
    Mutant("spanproc-lost-not-reported", "control/otel/span_process.py",
           "\"export_failed\": self._counts[\"export_failed\"] + self._lost}",
           "\"export_failed\": self._counts[\"export_failed\"]}",
           (_SPANS + "test_a_dead_span_process_costs_counted_drops_and_never_blocks",),
           "spans lost to a dead span process never reach /metrics: the export looks healthy"),
    Mutant("spanproc-child-not-niced", "control/otel/span_process.py",
           "        os.nice(CHILD_NICE)", "        os.nice(0)",
           (_SPANS + "test_the_span_process_runs_below_the_server_priority",),
           "the span process competes with the engine thread for the CPU at equal priority"),
    Mutant("spanproc-start-does-not-wait", "control/otel/span_process.py",
           "if wait_s and self._in.poll(wait_s):", "if False:",
           (_SPANS + "test_the_span_process_runs_below_the_server_priority",),
           "the server says it is ready before its span process is: first spans queue up"),
    Mutant("spanproc-counts-only-at-stop", "control/otel/span_process.py",
           "        if spans.counts != last:", "        if False:",
           (_SPANS + "test_the_counters_and_deliveries_reach_the_server_while_the_child_runs",),
           "the export counters on /metrics stay 0 until the server stops"),
    Mutant("spanproc-stop-timeout-ignored", "control/otel/span_process.py",
           "    spans.stop(stop_s)", "    spans.stop(5.0)",
           (_SPANS + "test_a_stopping_span_process_reports_within_the_stop_timeout",),
           "a server stopping with --otlp-timeout 1 waits on a dead collector for 5 s and"
           " loses the span process's last counts"),
    # ---- control/whatif/audit.py -------------------------------------------------------
    Mutant("audit-empty-change-recorded", "control/whatif/audit.py",
           "        if not change:\n            continue",
           "        if False:\n            continue",
           (_AUDIT + "test_each_proposal_that_changes_something_is_recorded",),
           "a proposal that changes nothing fills the audit with empty what-if rows"),
    Mutant("audit-live-diff-ignored", "control/whatif/audit.py",
           "change = {**config[\"diff\"], **_live_diff(live, config[\"patch\"])}",
           "change = config[\"diff\"]",
           (_AUDIT + "test_a_proposal_of_the_windows_own_values_is_recorded_when_the_live"
            "_config_moved",),
           "after a rollback, the prediction of the change the operator makes next is not"
           " recorded: the checklist says the change was not predicted"),
    Mutant("audit-ratio-two-places-lost", "control/whatif/audit.py",
           "f'{r:.2f}x'", "f'{r:.1f}x'",
           (_AUDIT + "test_each_proposal_that_changes_something_is_recorded",),
           "the audit note rounds a 1.04x regression to 1.0x"),
    Mutant("audit-note-shows-proposed-ratios", "control/whatif/audit.py",
           "row[\"ratios\"].get(name)", "row[\"ratios\"].get(\"proposed\")",
           (_AUDIT + "test_each_compared_config_notes_its_own_ratios_and_warnings",),
           "every compared config's audit row carries the main proposal's ratios"),
    Mutant("audit-note-counts-notes-as-warnings", "control/whatif/audit.py",
           "{len(result['warnings'])} warning(s)", "{len(result['notes'])} warning(s)",
           (_AUDIT + "test_each_compared_config_notes_its_own_ratios_and_warnings",),
           "the audit note's warning count is the count of informational notes"),
    Mutant("audit-unknown-lane-is-a-500", "control/whatif/audit.py",
           "    except ValueError:\n        return {}", "    except KeyError:\n        return {}",
           (_AUDIT + "test_a_proposal_for_a_lane_the_live_config_dropped_is_still_recorded",),
           "a what-if over a window whose lane the live config no longer has answers 500"),
    Mutant("audit-version-of-the-window", "control/whatif/audit.py",
           "live.live.version, WHATIF_SOURCE", "1, WHATIF_SOURCE",
           (_AUDIT + "test_a_proposal_of_the_windows_own_values_is_recorded_when_the_live"
            "_config_moved",),
           "the audit row names config version 1, not the one in force when it was asked"),
    # ---- engine/calibration/least_squares.py ------------------------------------------
    Mutant("nnls-zero-feature-divides-by-zero", "engine/calibration/least_squares.py",
           "    scale[scale == 0] = 1.0", "    pass",
           (_CAL + "test_the_held_out_error_is_of_a_fit_that_never_saw_those_steps",),
           "a feature no step had (no prompt chunks) makes every coefficient nan: the law"
           " predicts nan step times"),
    Mutant("nnls-qr-rescaled-wrong-way", "engine/calibration/least_squares.py",
           "return nnls(R, Q.T @ y) / scale", "return nnls(R, Q.T @ y) * scale",
           (_CAL + "test_the_fit_recovers_a_known_law_and_reports_its_error",),
           "a law fitted over many steps has its coefficients scaled by the feature's square:"
           " predictions off by orders of magnitude"),
    Mutant("nnls-stops-early", "engine/calibration/least_squares.py",
           "<= 1e-12 * (np.abs(w).max() + 1)", "<= 1e-2 * (np.abs(w).max() + 1)",
           (ENG + "test_step_time.py::test_the_fit_recovers_the_law_and_never_goes_negative",),
           "the start-up step law stops before its small terms enter: a decode step's cost"
           " per decode is left at 0, its fixed cost 50% too high"),
    Mutant("nnls-too-few-iterations", "engine/calibration/least_squares.py",
           "max_iter: int = 100", "max_iter: int = 3",
           (_CAL + "test_the_fit_recovers_a_known_law_and_reports_its_error",),
           "a law of seven terms is fitted with three: the rest are left at 0"),
    Mutant("nnls-enters-the-worst-feature", "engine/calibration/least_squares.py",
           "passive[np.argmax(np.where(passive, -np.inf, w))] = True",
           "passive[np.argmin(np.where(passive, np.inf, w))] = True",
           (_CAL + "test_coefficients_stay_non_negative_where_a_term_is_absent",),
           "the active set grows by the feature that would raise the error"),
    Mutant("nnls-small-coefficients-kept-active", "engine/calibration/least_squares.py",
           "            passive &= x > 1e-15\n", "            pass\n",
           (_CAL + "test_nnls_takes_a_coefficient_stepped_back_to_zero_out_of_the_fit",),
           "a coefficient stepped back to 0 stays in the active set: the next step back is"
           " by 0, forever, and the server's start-up calibration hangs"),
]
