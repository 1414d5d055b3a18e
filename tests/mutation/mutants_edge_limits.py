"""The server's trust boundary: request limits, bodies parsed by hand, unknown query
parameters, the fleet routing header, the edge process's handle, what crosses between the
event loop and the engine thread, the loop's abort words, the burst drain and the logprob
bound (pass of 2026-12-07); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, SEC, Mutant

LIM = "control/api/limits.py"
BODY = "control/api/body_parse.py"
QUERY = "control/api/query_check.py"
ROUTED = "control/api/routed.py"
EDGE = "control/edge/process.py"
STREAMS = "control/serve/streams.py"
ABORTS = "control/serve/loop_records.py"
BURSTS = "control/serve/bursts.py"
LOGPROBS = "engine/logprobs.py"

CLI_LIMITS = SEC + "test_tokens_and_limits.py::test_limits_from_the_command_line"
DOCUMENTED = (SEC + "test_tokens_and_limits.py::test_every_limit_is_documented_with_the_default"
              "_it_has")
VLLM_400 = CTL + "api/test_vllm_endpoints.py::test_bad_input_is_400_naming_the_field"
IGNORED = (CTL + "api/test_ignored_fields.py::test_tokenize_and_detokenize_name_them_in_a"
           "_header")
QUERY_400 = (SEC + "test_trace_auth.py::test_a_query_parameter_the_route_does_not_take_is_a_400"
             "_after_the_token")
ROUTED_T = CTL + "api/test_routed_header.py::"
EDGE_T = SEC + "test_edge_handle.py::"
EDGE_LIMITS = EDGE_T + "test_the_edge_enforces_the_limits_the_server_was_given"
EDGE_STOP = EDGE_T + "test_a_stopped_edge_leaves_no_socket_folder_behind"
LEFT = CTL + "api/test_disconnects.py::"
TIMEOUTS = CTL + "api/test_timeouts.py::"

LIMITS_MUTANTS: list[Mutant] = [
    Mutant("limit-zero-accepted", LIM, "or value <= 0:", "or value < 0:", (CLI_LIMITS,),
           "--limit max_body_bytes=0 is accepted: every request is a 413"),
    Mutant("limit-bool-accepted", LIM, "if isinstance(value, bool) or not isinstance",
           "if not isinstance",
           (SEC + "test_tokens_and_limits.py::test_a_limit_given_as_true_in_code_is_refused",),
           "RequestLimits(max_messages=True) in code runs with a limit of 1 message"),
    Mutant("limit-not-revalidated", LIM,
           "return dataclasses.replace(self, **changes).validate()",
           "return dataclasses.replace(self, **changes)", (CLI_LIMITS,),
           "--limit max_body_bytes=0 is taken: every request is refused"),
    Mutant("limit-seconds-as-whole-number", LIM, 'as_float = name.endswith("_s")',
           "as_float = False", (CLI_LIMITS,),
           "--limit grammar_compile_timeout_s=0.5 is refused as not a whole number"),
    Mutant("limit-bytes-as-float", LIM, 'as_float = name.endswith("_s")',
           'as_float = name.endswith("s")', (CLI_LIMITS,),
           "--limit max_body_bytes=1.5 is taken as a fractional byte count"),
    Mutant("limit-unknown-without-hint", LIM, "{did_you_mean([name], fields)}", "",
           (CLI_LIMITS,), "a misspelt --limit gets no 'did you mean' hint"),
    Mutant("default-body-40-mib", LIM, "max_body_bytes: int = 4 * MIB",
           "max_body_bytes: int = 40 * MIB", (DOCUMENTED,),
           "one client may send 40 MiB bodies for the server to buffer, not the documented 4"),
    Mutant("default-logit-bias-3000", LIM, "max_logit_bias: int = 300",
           "max_logit_bias: int = 3000", (DOCUMENTED,),
           "a request may bias 3000 tokens, ten times OpenAI's cap, applied every step"),
    Mutant("default-generated-tokens-x10", LIM, "max_generated_tokens: int = 65_536",
           "max_generated_tokens: int = 655_360", (DOCUMENTED,),
           "one request with n > 1 may ask for 655k tokens, holding the engine from others"),
    Mutant("default-stop-chars-2560", LIM, "max_stop_chars: int = 256",
           "max_stop_chars: int = 2560", (DOCUMENTED,),
           "stop strings of 2560 characters are matched against every step's text"),
    Mutant("default-grammar-compiles-4", LIM, "max_grammar_compiles: int = 2",
           "max_grammar_compiles: int = 4", (DOCUMENTED,),
           "four runaway schemas compile at once: a 2-core host has no core left for others"),
    Mutant("default-whatif-window-hours", LIM,
           "max_whatif_window_s: float = 7 * 24 * 3600.0",
           "max_whatif_window_s: float = 7 * 3600.0", (DOCUMENTED,),
           "a what-if over the documented week is refused past 7 hours"),
]

BODY_AND_QUERY_MUTANTS: list[Mutant] = [
    Mutant("body-deep-nesting-500", BODY, "except (ValueError, RecursionError) as exc:",
           "except ValueError as exc:", (VLLM_400,),
           "a /tokenize body nested 2,000 deep is a 500 (an error in the log), not a 400"),
    Mutant("body-validation-500", BODY,
           "raise RequestValidationError(exc.errors(include_url=False)) from None", "raise",
           (VLLM_400,), "/tokenize with a field of the wrong type is a 500 naming nothing"),
    Mutant("body-unknown-fields-unnamed", BODY,
           "unknown = sorted(set(raw) - set(model.model_fields))", "unknown: list[str] = []",
           (IGNORED,), "a misspelt /tokenize field is ignored silently"),
    Mutant("body-message-keys-unnamed", BODY,
           'nested = [getattr(m, "_ignored", []) for m in getattr(body, "messages", ())]',
           "nested: list[list[str]] = []", (IGNORED,),
           "a misspelt message key in a chat /tokenize is ignored silently"),
    Mutant("body-ignored-not-logged", BODY, "if names and warn_unknown:", "if False:",
           (CTL + "api/test_vllm_endpoints.py::test_fields_outside_the_shape_are_ignored_with"
            "_a_warning",), "the operator's log never says which fields clients get wrong"),
    Mutant("body-empty-ignored-header", BODY, "    if names:\n", "    if True:\n", (IGNORED,),
           "every /tokenize answer carries an empty X-Batchpilot-Ignored-Fields header"),
    Mutant("query-check-skipped", QUERY, "if not request.query_params:",
           "if request.query_params:", (QUERY_400,),
           "?sinse=-15m answers for all time again: the typo is never named"),
    Mutant("query-case-folded", QUERY, "unknown = sorted(set(request.query_params) - taken)",
           "unknown = sorted({k.lower() for k in request.query_params} - taken)",
           (SEC + "test_trace_auth.py::test_a_query_parameter_in_another_case_is_unknown",),
           "?Since=-15m passes the check, FastAPI ignores it: an answer for all time"),
    Mutant("query-no-param-named", QUERY, "param=unknown[0])", "param=None)", (QUERY_400,),
           "the 400 does not say in `param` which query parameter was wrong"),
    Mutant("query-takes-nothing-blank", QUERY,
           'takes = ", ".join(sorted(taken)) or "no query parameters"',
           'takes = ", ".join(sorted(taken))',
           (SEC + "test_trace_auth.py::test_the_control_api_refuses_an_unknown_query_parameter"
            "_and_openai_routes_ignore_it",),
           "a route without parameters answers '/control/history takes ' and nothing after"),
]

ROUTED_AND_EDGE_MUTANTS: list[Mutant] = [
    Mutant("routed-client-header-trusted", ROUTED,
           "value = headers.get(ROUTED_HEADER) if fleet_replica else None",
           "value = headers.get(ROUTED_HEADER)",
           (ROUTED_T + "test_a_replica_reads_the_ingress_decision_and_a_server_ignores_it",),
           "a client of a lone server writes its own routing story into the trace"),
    Mutant("routed-prefix-match", ROUTED, "_VALUE.fullmatch(value)", "_VALUE.match(value)",
           (ROUTED_T + "test_garbled_values_read_as_no_decision",),
           "a routing header with a tail of garbage is read as a decision"),
    Mutant("routed-reason-unbounded", ROUTED, "reason=([a-z_]{1,32})", "reason=([a-z_]+)",
           (ROUTED_T + "test_garbled_values_read_as_no_decision",),
           "a routing reason of any length lands in every trace row"),
    Mutant("routed-zero-blocks-unknown", ROUTED, 'blocks = "" if matched_blocks is None',
           'blocks = "" if not matched_blocks',
           (ROUTED_T + "test_a_precise_route_to_a_cold_replica_says_it_matched_no_blocks",),
           "a precise route with 0 matched blocks reads as 'blocks unknown' in the trace"),
    Mutant("edge-socket-folder-open", EDGE,
           'folder = tempfile.mkdtemp(prefix="batchpilot-")  # mode 0700',
           'folder = tempfile.mkdtemp(prefix="batchpilot-")\n    os.chmod(folder, 0o755)',
           (EDGE_STOP,),
           "any local user may reach the server's socket behind the edge, past its limits"),
    Mutant("edge-default-limits", EDGE, '"--limits", json.dumps(dataclasses.asdict(limits))',
           '"--limits", "{}"', (EDGE_LIMITS,),
           "the edge enforces the default limits: the operator's --limit is not applied there"),
    Mutant("edge-same-session", EDGE, "start_new_session=True", "start_new_session=False",
           (EDGE_T + "test_the_edge_runs_on_beside_its_server_out_of_reach_of_a_ctrl_c",),
           "Ctrl+C kills the edge at once: requests in flight are cut, not drained"),
    Mutant("edge-url-from-the-wrong-side", EDGE, 'return line.rsplit(" at ", 1)[1].strip()',
           'return line.rsplit(" at ", 1)[0].strip()', (EDGE_LIMITS,),
           "the server announces 'batchpilot-edge: listening' as its URL"),
    Mutant("edge-stop-leaves-socket", EDGE,
           "                self.proc.wait()\n        remove_socket(self.uds)",
           "                self.proc.wait()", (EDGE_STOP,),
           "every server behind an edge leaves its socket folder in /tmp"),
    Mutant("edge-wrong-parent", EDGE, '"--parent", str(os.getpid())',
           '"--parent", str(os.getppid())',
           (EDGE_T + "test_the_edge_runs_on_beside_its_server_out_of_reach_of_a_ctrl_c",),
           "the edge takes itself for orphaned and exits: the server stops right after start"),
    Mutant("edge-exit-not-seen", EDGE, "        self._lines.put(None)\n", "",
           (EDGE_T + "test_an_edge_that_cannot_listen_is_reported_at_once",),
           "an edge that cannot bind its port holds the server's start for a minute"),
]

LOOP_MUTANTS: list[Mutant] = [
    Mutant("stream-tokens-of-the-delta", STREAMS, "len(out.token_ids), out.finished",
           "len(out.delta_token_ids), out.finished",
           (CTL + "api/test_http_api.py::test_completion_carries_usage_timing_and_headers",),
           "usage's completion_tokens counts only the last step's tokens"),
    Mutant("stream-prompt-logprobs-dropped", STREAMS,
           "tuple(out.delta_logprobs), out.prompt_logprobs)",
           "tuple(out.delta_logprobs), None)",
           (CTL + "api/test_logprobs_api.py::test_vllm_prompt_logprobs",),
           "prompt_logprobs asked for never come back"),
    Mutant("stream-step-done-lost", STREAMS, "                   step_done, tuple(",
           "                   0.0, tuple(",
           (CTL + "api/test_delivery_metrics.py::test_stream_and_body_deliveries_are"
            "_observed",), "the way from the engine to the client is never measured"),
    Mutant("resolve-after-the-awaiter-left", STREAMS,
           "    if future.done():\n        return\n", "",
           (LEFT + "test_a_client_that_leaves_before_admission_leaves_no_error_in_the_log",),
           "each client that leaves before admission logs an asyncio error with a traceback"),
    Mutant("abort-disconnect-as-timeout", ABORTS,
           '"client_disconnect": (RequestStatus.CANCELLED',
           '"client_disconnect": (RequestStatus.TIMEOUT',
           (LEFT + "test_a_queued_request_whose_client_leaves_never_runs",),
           "clients that leave are counted as timeouts: a timeout alert fires on them"),
    Mutant("abort-timeout-as-cancelled", ABORTS, '"request_timeout": (RequestStatus.TIMEOUT',
           '"request_timeout": (RequestStatus.CANCELLED',
           (TIMEOUTS + "test_a_request_out_of_time_answers_with_what_it_has",),
           "a request out of time ends with finish_reason 'cancelled', not 'timeout'"),
    Mutant("abort-idle-as-cancelled", ABORTS,
           '"stream_idle_timeout": (RequestStatus.TIMEOUT',
           '"stream_idle_timeout": (RequestStatus.CANCELLED',
           (TIMEOUTS + "test_stream_idle_timeout_ends_a_stalled_stream",),
           "a stalled stream ends with finish_reason 'cancelled', not 'timeout'"),
    Mutant("abort-shutdown-as-error", ABORTS, '"shutdown": (RequestStatus.CANCELLED',
           '"shutdown": (RequestStatus.ERROR',
           (CTL + "api/test_errors.py::test_a_request_the_shutdown_cuts_is_503_with_retry"
            "_after",), "every rolling restart counts its cut requests as engine errors"),
    Mutant("drain-stops-at-the-yield", BURSTS, "            time.sleep(0)",
           "            return",
           (CTL + "trace/test_trace_writer.py::test_tables_agree_with_each_other_and_with_the"
            "_metrics",), "the trace writer takes 7 items a wake-up: the trace falls behind"),
    Mutant("logprobs-bound-21", LOGPROBS, "MAX_LOGPROBS = 20", "MAX_LOGPROBS = 21",
           (CTL + "api/test_logprobs_api.py::test_bad_chat_values_are_400_naming_the_field",),
           "top_logprobs=21, which OpenAI refuses, is taken"),
    Mutant("sampled-logprobs-lost", LOGPROBS, "self.logprobs = logprobs",
           "self.logprobs = None",
           (ENG + "test_logprobs.py::test_greedy_logprobs_equal_a_direct_forward",),
           "logprobs asked for are never returned"),
    Mutant("sampled-prompt-logprobs-lost", LOGPROBS,
           "self.prompt_logprobs = prompt_logprobs or {}", "self.prompt_logprobs = {}",
           (ENG + "test_logprobs.py::test_a_prefill_recomputed_after_a_preemption_scores_only"
            "_the_new_positions",), "prompt_logprobs asked for never come back"),
]

EDGE_LIMITS_MUTANTS: list[Mutant] = [*LIMITS_MUTANTS, *BODY_AND_QUERY_MUTANTS,
                                     *ROUTED_AND_EDGE_MUTANTS, *LOOP_MUTANTS]
