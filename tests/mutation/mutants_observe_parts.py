"""Mutants for the OpenTelemetry export and feed, the metrics observer, the trace queries, the
what-if window, calibration and capacity sweep, and the fleet's KV index and prefix keys (pass
of 2026-12-08: each module had at most two planted bugs); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

EX = "control/otel/export.py"
FD = "control/otel/feed.py"
OB = "control/metrics/observer.py"
QU = "control/trace/queries.py"
WI = "control/whatif/window.py"
CA = "control/whatif/calibrate.py"
CP = "control/whatif/capacity.py"
KI = "control/fleet/kv_index.py"
PK = "control/fleet/prefix_keys.py"

OTEL_T = CTL + "otel/test_otel_export_edges.py::"
FLUSH_T = OTEL_T + "test_a_partial_batch_is_exported_within_flush_every_s"
STOP_T = OTEL_T + "test_a_stop_exports_every_span_still_queued"
FAILED_T = OTEL_T + "test_a_failed_batch_counts_each_span_and_is_warned_about_once"
HEX_T = OTEL_T + "test_delivered_trace_ids_are_32_hex_digits_once_each"
OLDEST_T = OTEL_T + "test_delivered_traces_forget_the_oldest_first"
PHASES_T = OTEL_T + "test_the_feed_builds_each_kept_requests_phases_and_forgets_every_ended_one"
STEP_BACKLOG_T = OTEL_T + "test_a_full_step_backlog_drops_and_counts_the_step"
LAST_WAKE_T = OTEL_T + "test_a_stopping_feed_exports_the_requests_of_its_last_wake_up"
KEPT_T = OTEL_T + "test_errors_and_timeouts_are_kept_at_ratio_zero"
SAMPLED_T = CTL + "otel/test_sampling_rule.py::test_the_sampling_counter_counts_only_requests" \
    "_that_had_a_trace"

OBS_T = CTL + "metrics/test_observer_edges.py::"
PERIODIC_T = OBS_T + "test_a_crossing_on_a_periodic_step_is_named_as_the_crossing"
BACKLOG_T = OBS_T + "test_a_full_metrics_backlog_drops_and_counts_the_step"
SPANS_T = OBS_T + "test_the_span_feed_gets_every_step_and_stops_with_the_observer"
REFIT_T = OBS_T + "test_a_law_refit_is_an_audit_row_of_the_old_law_then_the_new"
WRITER_T = OBS_T + "test_the_writer_counters_keep_written_and_dropped_rows_apart"

QU_T = CTL + "trace/test_trace_queries_edges.py::"
ENDS_T = QU_T + "test_a_window_keeps_both_its_ends_and_nothing_past_them"
EMPTY_T = QU_T + "test_a_window_whose_since_is_after_its_until_is_refused"
REJECTED_T = QU_T + "test_latency_percentiles_leave_rejections_out"
REASONS_T = QU_T + "test_slow_names_the_step_sizes_it_waited_through_up_to_its_first_token"
AROUND_T = QU_T + "test_steps_around_a_moment_are_in_time_order"
RESENT_T = QU_T + "test_a_resent_request_id_shows_its_latest_request"

WE_T = CTL + "whatif/test_whatif_window_edges.py::"
ITL_T = WE_T + "test_a_requests_inter_token_gaps_are_one_per_decoded_token"
LATEST_T = WE_T + "test_calibration_reads_the_latest_steps_of_the_window"
TWO_RUNS_T = WE_T + "test_a_window_of_two_runs_replays_the_run_with_the_most_requests"
ZERO_T = WE_T + "test_a_step_of_zero_seconds_leaves_the_fit_finite"
GAP_T = WE_T + "test_the_loop_gap_is_the_median_and_one_long_pause_does_not_move_it"
THIN_T = WE_T + "test_exactly_min_steps_are_not_said_to_be_too_few"
RELATIVE_T = WE_T + "test_short_decode_steps_are_fitted_beside_long_prompt_steps"
DEADLINE_T = WE_T + "test_a_scaled_deadline_keeps_its_distance_from_arrival"
ROW_T = WE_T + "test_a_capacity_row_reads_goodput_as_a_share_of_the_offered_requests"
CAPACITY_T = WE_T + "test_capacity_is_the_highest_rate_up_to_which_every_rate_met_the_slo"
WIDER_T = CTL + "whatif/test_whatif_capacity.py::test_a_window_asked_wider_than_its_traffic" \
    "_spans_the_traffic"
DENSER_T = CTL + "whatif/test_whatif_capacity.py::test_a_scaled_window_is_the_same_requests" \
    "_denser"
CHANGE_T = CTL + "whatif/test_whatif_changes.py::test_the_recorded_config_of_a_window_after_a" \
    "_change_carries_it"
CALIBRATE_T = CTL + "whatif/test_whatif_calibrate.py::"
RECOVERS_T = CALIBRATE_T + "test_the_fit_recovers_a_known_law_and_reports_its_error"
HELD_OUT_T = CALIBRATE_T + "test_the_held_out_error_is_of_a_fit_that_never_saw_those_steps"

KV_T = CTL + "fleet/test_kv_index_edges.py::"
CACHING_T = KV_T + "test_a_replica_with_prefix_caching_off_turns_the_index_off"
OUTLIVES_T = KV_T + "test_a_follower_outlives_a_replica_that_failed_a_read"
SLOT_OFF_T = KV_T + "test_a_replica_whose_slot_is_off_is_not_read_until_it_is_on"
NO_EVENTS_T = KV_T + "test_a_replica_without_events_is_followed_no_more"
TENANT_T = KV_T + "test_each_tenant_has_its_own_keys_and_the_same_tenant_the_same"
SALT_T = KV_T + "test_a_cache_salt_is_a_domain_of_its_own"
CUT_T = KV_T + "test_a_prompt_cut_at_max_chars_drops_the_block_the_cut_may_split"
LAST_TOKEN_T = KV_T + "test_the_block_of_the_last_prompt_token_has_no_key"
SPECIAL_T = KV_T + "test_add_special_tokens_is_the_bodys"
RESTART_T = CTL + "fleet/test_kv_index.py::test_snapshot_then_batches_then_a_restart_snapshot"

OBSERVE_PARTS_MUTANTS: list[Mutant] = [
    # ---- the span export (control/otel/export.py) ----------------------------------------
    Mutant("export-partial-batch-never-flushed", EX,
           "if batch and (len(batch) >= BATCH_SPANS or time.monotonic() >= due or stopping):",
           "if batch and (len(batch) >= BATCH_SPANS or stopping):", (FLUSH_T,),
           "a quiet server's last spans wait for 511 more or a shutdown: the on-call engineer"
           " finds no trace of the slow request they were sent"),
    Mutant("export-stop-drops-queued", EX,
           "if stopping and self._spans.empty() and not batch:", "if stopping:", (STOP_T,),
           "a server shutting down while the collector is slow loses the spans still queued,"
           " the last requests' traces included"),
    Mutant("export-failures-counted-per-batch", EX,
           'self.counts["exported" if ok else "export_failed"] += len(batch)',
           'self.counts["exported" if ok else "export_failed"] += 1', (FAILED_T,),
           "batchpilot_otel_spans_dropped_total{reason=\"export_failed\"} counts batches: a"
           " collector outage losing 512 spans a batch reads as a handful"),
    Mutant("export-refused-batch-delivered", EX, "if ok and self.on_delivered is not None:",
           "if self.on_delivered is not None:", (FAILED_T,),
           "latency exemplars link to traces the collector refused: the operator clicks"
           " through to 'trace not found'"),
    Mutant("export-trace-id-unpadded", EX, 'f"{span.context.trace_id:032x}"',
           'f"{span.context.trace_id:x}"', (HEX_T,),
           "a trace id with leading zero digits never matches its exemplar: those requests"
           " lose their exemplar link"),
    Mutant("export-warns-every-batch", EX, "self._next_warning = now + WARN_EVERY_S",
           "self._next_warning = now", (FAILED_T,),
           "a collector that is down floods the server's log with a warning per batch"),
    Mutant("delivered-forgets-newest", EX, "self._ids.popitem(last=False)",
           "self._ids.popitem()", (OLDEST_T,),
           "once 65k traces were delivered, each new one is forgotten at once: new requests"
           " never get an exemplar while old ones keep theirs"),
    # ---- the span feed (control/otel/feed.py) ---------------------------------------------
    Mutant("feed-sampling-inverted", FD, "if not keep(rec, self.settings):",
           "if keep(rec, self.settings):", (KEPT_T, SAMPLED_T),
           "errors and timeouts are the spans dropped and ordinary requests the ones exported:"
           " the traces an on-call engineer needs are the ones missing"),
    Mutant("feed-backlog-one-over", FD, "if self._steps.qsize() >= MAX_STEP_BACKLOG:",
           "if self._steps.qsize() > MAX_STEP_BACKLOG:", (STEP_BACKLOG_T,),
           "the span thread's queue holds one step past its bound before it drops and counts"),
    Mutant("feed-stop-loses-last-wake-up", FD,
           "                if item is None:\n"
           "                    self.sink.send(kept)\n"
           "                    return\n",
           "                if item is None:\n"
           "                    return\n", (LAST_WAKE_T,),
           "the requests that ended in a server's last 100 ms before a shutdown (a failing"
           " deploy's errors) are never exported"),
    Mutant("feed-admissions-skipped", FD,
           "        for decision in item.admissions:\n"
           "            self.tracker.on_admission(decision)\n", "", (PHASES_T,),
           "exported requests have no phases: no queue, prefill or decode spans, just the"
           " request's own"),
    Mutant("feed-steps-skipped", FD,
           "        if item.record is not None:\n"
           "            self.tracker.on_step(item.record)\n", "", (PHASES_T,),
           "a request's trace shows no prefill chunks or preemptions: where its time went is"
           " not in the trace"),
    Mutant("feed-sampled-out-phases-kept", FD,
           "            phases = self.tracker.on_finished(rec)\n"
           "            if not keep(rec, self.settings):\n"
           '                self.requests["not_sampled"] += rec.trace is not None\n'
           "                continue\n",
           "            if not keep(rec, self.settings):\n"
           '                self.requests["not_sampled"] += rec.trace is not None\n'
           "                continue\n"
           "            phases = self.tracker.on_finished(rec)\n", (PHASES_T,),
           "every sampled-out request's phases stay in the span thread until it is stale: at"
           " a low sample ratio the server's memory grows with its traffic"),
    # ---- the observer (control/metrics/observer.py) ---------------------------------------
    Mutant("observer-band-not-remembered", OB, "            self._band = band\n", "",
           (PERIODIC_T,), "KV snapshots at every step above the watermark, none on the way"
           " back down: the trace fills up and the recovery is not in it"),
    Mutant("observer-crossing-filed-periodic", OB,
           "if trigger is None and record.step_id % self.kv_snapshot_every == 0:",
           "if record.step_id % self.kv_snapshot_every == 0:", (PERIODIC_T,),
           "a watermark crossing on a periodic step is filed as periodic: `trace report`"
           " misses that KV pressure started there"),
    Mutant("observer-backlog-one-over", OB, "if self._queue.qsize() >= MAX_BACKLOG:",
           "if self._queue.qsize() > MAX_BACKLOG:", (BACKLOG_T,),
           "the metrics thread's queue holds one step past its bound before it drops and"
           " counts"),
    Mutant("observer-spans-not-stopped", OB,
           "        if self.spans is not None:\n            self.spans.stop()\n", "",
           (SPANS_T,), "a server shutting down never flushes its span feed: the last"
           " requests' traces are lost"),
    Mutant("observer-law-refit-reversed", OB, '{"step_law": [old, new]}',
           '{"step_law": [new, old]}', (REFIT_T,),
           "the audit row says the law went from new to old: a what-if after a refit"
           " replays under the law the server had dropped"),
    Mutant("observer-writer-counters-swapped", OB,
           '"Trace rows committed to DuckDB, by table.", model, stats.written)',
           '"Trace rows committed to DuckDB, by table.", model, stats.dropped)', (WRITER_T,),
           "batchpilot_trace_records_written_total shows the dropped rows: a trace losing"
           " rows looks like one writing few"),
    # ---- the trace queries (control/trace/queries.py) -------------------------------------
    Mutant("queries-until-ignored", QU,
           "    if until is not None:\n"
           '        clauses.append(f"{column} <= ?")\n'
           "        params.append(until)\n", "", (ENDS_T,),
           "`trace summary --until` and every window's end are ignored: an incident's"
           " figures include the recovery after it"),
    Mutant("queries-empty-window-answered", QU,
           "    checked_window(since, until)\n    clauses, params = [], []",
           "    clauses, params = [], []", (EMPTY_T,),
           "--since after --until answers nothing instead of a usage error: it reads as a"
           " window without traffic"),
    Mutant("queries-latency-counts-rejections", QU,
           "ran = \"FILTER (WHERE outcome <> 'rejected')\"", 'ran = ""', (REJECTED_T,),
           "rejections' e2e of 0 pull the latency percentiles down: an overloaded server"
           " looks faster the more it refuses"),
    Mutant("queries-step-reasons-to-finish", QU,
           "coalesce(first_token_time, finished_time) AS first_token_or_end",
           "coalesce(finished_time, first_token_time) AS first_token_or_end", (REASONS_T,),
           "`trace slow` blames the step sizes of a request's decodes for its slow first"
           " token"),
    Mutant("queries-around-newest-first", QU,
           "return _with_request_ids(con, earlier[::-1] + later)",
           "return _with_request_ids(con, earlier + later)", (AROUND_T,),
           "`trace steps --at` lists the steps before the moment newest first, then the ones"
           " after oldest first: the timeline reads out of order"),
    Mutant("queries-timeline-oldest-request", QU, '" DESC LIMIT 1", [request_id])',
           '" LIMIT 1", [request_id])', (RESENT_T,),
           "`trace request` of a request id used again shows the old request, not the one the"
           " client is asking about"),
    # ---- the what-if window (control/whatif/window.py) ------------------------------------
    Mutant("window-cut-by-finish", WI,
           '" AND arrival_time <= ? ORDER BY arrival_time, request_id"',
           '" AND finished_time <= ? ORDER BY arrival_time, request_id"', (WIDER_T,),
           "a window cut at --until leaves out the requests still running then: their load"
           " vanishes from the replay"),
    Mutant("window-until-not-clamped", WI,
           "hi = last_end if until is None else min(until, last_end)",
           "hi = last_end if until is None else until", (WIDER_T,),
           "`--until now` after a short load test spreads its traffic over the idle time:"
           " goodput and offered rates read far too low"),
    Mutant("window-changes-past-its-start", WI, '" version <= ? ORDER BY version, time"',
           '" version >= ? ORDER BY version, time"', (CHANGE_T,),
           "a window before a config change is replayed under the change that came after it"),
    Mutant("window-itl-counts-prompt-chunks", WI,
           "WHERE phase = 'decode' AND prev IS NOT NULL", "WHERE prev IS NOT NULL", (ITL_T,),
           "the recorded inter-token latency includes the gaps between a prompt's chunks:"
           " the what-if compares its TPOT with a wrong recorded one"),
    Mutant("window-calibrates-oldest-steps", WI, 'ORDER BY start_time DESC"',
           'ORDER BY start_time"', (LATEST_T,),
           "past 200k steps the calibration reads every step instead of the latest: slow on"
           " a day's trace, and fitted to the device as it was hours ago"),
    Mutant("window-runs-mixed", WI,
           "        requests = [r for r in requests if r.run_id == run_id]\n", "",
           (TWO_RUNS_T,), "a window across a restart replays both runs' requests on one"
           " engine: twice the load that server ever saw"),
    # ---- calibration (control/whatif/calibrate.py) ----------------------------------------
    Mutant("calibrate-nothing-held-out", CA, "% HOLDOUT_EVERY == HOLDOUT_EVERY - 1",
           "% HOLDOUT_EVERY == HOLDOUT_EVERY", (RECOVERS_T,),
           "no step is held out: the held-out error is never reported"),
    Mutant("calibrate-zero-step-unfloored", CA, "weight = 1.0 / np.maximum(y, MIN_STEP_S)",
           "weight = 1.0 / y", (ZERO_T,),
           "one step recorded as 0 s makes the fit's weights infinite: every prediction is"
           " NaN"),
    Mutant("calibrate-gap-mean", CA, "gap = float(np.median(samples.gaps))",
           "gap = float(np.mean(samples.gaps))", (GAP_T,),
           "one long pause (a GC, a swap) is spread as loop overhead over every predicted"
           " step: every latency reads high"),
    Mutant("calibrate-thin-boundary", CA, "if len(y) < MIN_STEPS:", "if len(y) <= MIN_STEPS:",
           (THIN_T,), "a fit on exactly MIN_STEPS steps is said to be unreliable"),
    Mutant("calibrate-error-as-fraction", CA,
           "pct = np.abs(resid) / np.maximum(y, 1e-9) * 100.0",
           "pct = np.abs(resid) / np.maximum(y, 1e-9)", (HELD_OUT_T,),
           "fit errors are fractions shown as %: a law 30% off reads 0.3% and its warning"
           " never fires"),
    Mutant("calibrate-fit-in-seconds", CA,
           "return fit_nonnegative(X * weight[:, None], y * weight)",
           "return fit_nonnegative(X, y)", (RELATIVE_T,),
           "long prompt steps rule the fit: short decode steps are predicted ~25% off, and"
           " the replay's TPOT with them"),
    # ---- the capacity sweep (control/whatif/capacity.py) ----------------------------------
    Mutant("capacity-window-not-shortened", CP, "until=since + (window.until - since) / k)",
           "until=window.until)", (DENSER_T,),
           "a sweep's offered rate and goodput at 2x are per second of the 1x window: they"
           " read half what they are"),
    Mutant("capacity-deadline-unmoved", CP,
           "deadline=None if r.deadline is None else arrival + (r.deadline - r.arrival_time))",
           "deadline=r.deadline)", (DEADLINE_T,),
           "at twice the rate a request's deadline stays where it was: requests get more or"
           " less time than their client gave them"),
    Mutant("capacity-share-of-finished", CP, 'else met / s["requests"]',
           'else met / s["finished"]', (ROW_T,),
           "the share meeting the SLO leaves rejections out: a config that refuses half the"
           " traffic shows capacity to spare"),
    Mutant("capacity-goodput-rate-as-count", CP,
           'else s["goodput_rps"] * window.duration_s', 'else s["goodput_rps"]', (ROW_T,),
           "goodput per second is divided by a count of requests: every config's share, and"
           " capacity, reads near zero"),
    Mutant("capacity-skips-a-missed-rate", CP,
           "                break\n            capacity[name] = r[\"rate_scale\"]",
           "                continue\n            capacity[name] = r[\"rate_scale\"]",
           (CAPACITY_T,), "a config that misses its SLO at 2x but scrapes by at 4x is said"
           " to handle 4x"),
    Mutant("capacity-row-of-unscaled-window", CP,
           "table[name].append(capacity_row(k, scaled, p, slo))",
           "table[name].append(capacity_row(k, window, p, slo))", (CAPACITY_T,),
           "each rate's offered rate and goodput are per second of the recorded window, not"
           " the scaled one"),
    # ---- the KV index (control/fleet/kv_index.py) -----------------------------------------
    Mutant("index-restart-snapshot-merged", KI, 'blocks.keys = set(reply["snapshot"])',
           'blocks.keys.update(reply["snapshot"])', (RESTART_T,),
           "a restarted replica keeps its old blocks in the index: prefixes are routed to a"
           " cache it lost"),
    Mutant("index-credits-replica-0", KI,
           "return {i: self.matched(i, keys) for i in range(len(self.replicas))}",
           "return {i: self.matched(0, keys) for i in range(len(self.replicas))}",
           (RESTART_T,), "every replica is credited with replica 0's cache: precise routing"
           " places requests by a cache they do not have"),
    Mutant("index-prefix-caching-ignored", KI,
           'self.enabled = bool(reply.get("prefix_caching", True))', "self.enabled = True",
           (CACHING_T,), "a fleet with prefix caching off still routes by prefix: its load"
           " is skewed for hits that never happen"),
    Mutant("follow-dies-on-a-failed-read", KI,
           "        except Exception:  # down or restarting: the load poll says so",
           "        except (asyncio.TimeoutError, OSError):  # down or restarting",
           (OUTLIVES_T,), "one error from a restarting replica ends its follower: the router"
           " never again sees that replica's cache"),
    Mutant("follow-reads-inactive-slots", KI, "if active is not None and not active():",
           "if active is not None and active():", (SLOT_OFF_T,),
           "the ingress polls the slots autoscaling has off and never the ones it has on"),
    Mutant("follow-polls-replica-without-events", KI,
           "                return  # this replica publishes no events: nothing to follow",
           "                pass", (NO_EVENTS_T,),
           "the ingress keeps polling replicas that publish no KV events, ten times a second"
           " each, forever"),
    # ---- the prefix keys (control/fleet/prefix_keys.py) -----------------------------------
    Mutant("prefix-keys-ignore-tenant", PK, "digest, keys = hasher.root(*domain), []",
           'digest, keys = hasher.root("default", domain[1]), []', (TENANT_T,),
           "a trust boundary: tenant B's request is credited with tenant A's cache and"
           " routed by it, as if they shared one"),
    Mutant("prefix-keys-ignore-salt", PK,
           "return tenant, salt if isinstance(salt, str) else None", "return tenant, None",
           (SALT_T,), "a request with its own cache_salt is routed by the tenant's shared"
           " cache, which its replica keeps apart"),
    Mutant("prefix-keys-ignore-user", PK,
           "tenant = tenant_of(headers, user if isinstance(user, str) else None)",
           "tenant = tenant_of(headers, None)", (TENANT_T,),
           "tenants named by the body's `user` all share the default tenant's keys: one's"
           " cache is credited to another"),
    Mutant("prefix-keys-cut-block-kept", PK,
           "            if cut:  # the last block may hold a token the cut split\n"
           "                ids = ids[:max(0, len(ids) - block_size)]\n", "", (CUT_T,),
           "a long prompt's last looked-up block may hold a split token: a key no replica"
           " has, and its prefix is under-credited"),
    Mutant("prefix-keys-last-token-block", PK, "blocks = (len(ids) - 1) // block_size",
           "blocks = len(ids) // block_size", (LAST_TOKEN_T,),
           "a prompt of whole blocks looks up one block its replica never caches: no replica"
           " matches it in full"),
    Mutant("prefix-keys-special-tokens-forced", PK,
           "return self._encode(prompt, completion.add_special_tokens)",
           "return self._encode(prompt, True)", (SPECIAL_T,),
           "a completion sent with add_special_tokens=false is hashed with a BOS its replica"
           " never adds: none of its blocks match, and it is placed without its cache"),
]
