"""The HTTP server's edge, start-up and shutdown, and `make run` (pass of 2026-12-07); each
has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, SEC, Mutant

SERVER_EDGE_MUTANTS: list[Mutant] = [
    Mutant("retry-after-rounded-down", "control/api/errors.py",
           "max(1, math.ceil(seconds or 1.0))", "max(1, int(seconds or 1.0))",
           (CTL + "api/test_errors.py::test_retry_after_is_the_wait_in_whole_seconds_rounded_up",),
           "a refusal whose wait is 2.4 s says Retry-After: 2, and the client comes back early"),
    Mutant("echo-clipped-at-its-limit", "control/api/errors.py",
           "    if len(text) <= limit:", "    if len(text) < limit:",
           (SEC + "test_echo_bounds.py::test_a_value_of_exactly_the_echo_limit_is_quoted_whole",),
           "a model name of exactly ECHO_CHARS characters comes back clipped in its 404"),
    Mutant("http-error-headers-lost", "control/api/errors.py",
           "headers=dict(exc.headers or {})).response()", "headers={}).response()",
           (CTL + "api/test_errors.py::test_a_wrong_method_is_a_405_naming_the_methods_the_route"
            "_takes",),
           "a 405 loses its Allow header (and a Starlette 413 its Connection: close)"),
    Mutant("4xx-typed-server-error", "control/api/errors.py",
           'default = "invalid_request_error" if status < 500 else "server_error"',
           'default = "server_error"',
           (SEC + "test_trace_auth.py::test_a_refused_token_is_typed_as_the_clients_error",),
           "a 401 for a missing token is typed server_error, and an SDK retries it"),
    Mutant("empty-tools-refused", "control/api/vllm_schemas.py",
           "        if value not in (None, [], {}):", "        if value is not None:",
           (CTL + "api/test_vllm_endpoints.py::test_empty_values_of_unsupported_fields_count_as_not"
            "_sent",),
           "/tokenize of a chat that sends tools: [] (as many clients always do) is a 400"),
    Mutant("yaml-over-engine-overrides", "control/serve/bootstrap.py",
           "{**serving.explicit, **settings.engine_overrides}",
           "{**settings.engine_overrides, **serving.explicit}",
           (CTL + "serve/test_config_fit.py::test_engine_overrides_win_over_the_yaml",),
           "the YAML's values beat ServeSettings.engine_overrides (a fleet's replica sizes)"),
    Mutant("preflight-skips-trace-file", "control/serve/preflight.py",
           "    check_trace_db(settings.trace_db)\n", "",
           (CTL + "serve/test_config_fit.py::test_preflight_refuses_a_trace_file_it_could_not"
            "_write",),
           "a --trace-db in a missing folder fails only after the model loaded"),
    Mutant("shutdown-leaves-requests-running", "control/api/app.py",
           '            engine.abort_all("shutdown")\n', "",
           (CTL + "serve/test_lifespan.py::test_a_request_still_running_at_shutdown_is"
            "_ended_and_traced",),
           "a request still running when the server stops never gets its trace row"),
    Mutant("public-server-checks-host", "control/api/app.py",
           "check_host=not state.control_tokens\n                       and settings.host in"
           " LOOPBACK_HOSTS,",
           "check_host=not state.control_tokens,",
           (SEC + "test_origin_and_body.py::test_a_public_server_without_tokens_serves_any_host"
            "_name",),
           "a public server without tokens answers 421 to every client that names its host"),
    Mutant("app-skips-trace-exposure", "control/api/app.py",
           "control_api=settings.control_api,\n                   trace=bool(settings.trace_db))",
           "control_api=settings.control_api,\n                   trace=False)",
           (SEC + "test_tokens_and_limits.py::test_an_app_built_in_code_refuses_a_public_trace"
            "_without_tokens",),
           "create_app on 0.0.0.0 with a trace and no tokens lets anyone read every tenant"),
    Mutant("make-run-host-dropped", "control/serve/run_all.py",
           '"--host", args.host, "--port"', '"--port"',
           (CTL + "serve/test_run_all.py::test_make_run_starts_the_server_on_its_host_and_port",),
           "make run --host 0.0.0.0 still serves on 127.0.0.1 only"),
    Mutant("make-run-exits-zero", "control/serve/run_all.py",
           "    return server.returncode or 0", "    return 0",
           (CTL + "serve/test_run_all.py::test_make_run_exits_with_the_servers_failure",),
           "make run exits 0 although the server failed"),
    Mutant("server-trace-without-retention", "control/api/app.py",
           "kv_snapshot_every=settings.kv_snapshot_every,\n"
           "                                   retention=settings.trace_retention)",
           "kv_snapshot_every=settings.kv_snapshot_every)",
           (CTL + "trace/test_trace_retention.py::test_the_servers_trace_keeps_the_retention_it_was"
            "_given",),
           "--trace-max-age-s / --trace-max-bytes are ignored and the trace grows without bound"),
    Mutant("edge-time-not-counted", "control/api/app.py",
           "app.add_middleware(StampArrival, behind_edge=settings.behind_edge)",
           "app.add_middleware(StampArrival, behind_edge=False)",
           (CTL + "api/test_arrival_limits.py::test_only_a_server_behind_its_edge_counts_the_edges"
            "_time",),
           "behind its edge, the time a request spent in the edge is missing from its latencies"),
    Mutant("run-settings-without-fitted-budgets", "control/api/app.py",
           "target_step_ms=fit.target_step_ms,\n"
           "                        fitted_budgets=dict(fit.fitted))",
           "target_step_ms=fit.target_step_ms)",
           (CTL + "serve/test_lifespan.py::test_the_run_settings_keep_the_budgets_fitted_at_start"
            "_up",),
           "a what-if replay of the trace starts from the default budgets, not the fitted ones"),
    Mutant("body-priority-unbounded", "control/api/request_meta.py",
           "    elif priority is not None and not -PRIORITY_LIMIT <= priority < PRIORITY_LIMIT:",
           "    elif False:",
           (SEC + "test_control_door.py::test_a_body_priority_outside_32_bits_is_a_400_naming_it",),
           "a body priority of 2**31 or more is served instead of a 400 naming `priority`"),
    Mutant("prompt-capacity-past-the-pool", "control/serve/bootstrap.py",
           "return min(static.max_model_len, static.num_kv_blocks",
           "return max(static.max_model_len, static.num_kv_blocks",
           (CTL + "api/test_errors.py::test_a_chat_without_max_tokens_gets_what_the_kv_pool"
            "_leaves",),
           "a chat without max_tokens on a pool smaller than the context is refused as too long"),
]
