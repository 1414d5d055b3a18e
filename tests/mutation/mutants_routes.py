"""The trace read API's, the OpenAI routes' and the fleet front door's own checks (pass of
2026-12-07, late: each file had one planted bug or none); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, SEC, Mutant

TRACE_R = "control/trace/routes.py"
API_R = "control/api/routes.py"
TENANT_T = SEC + "test_tenant_tokens.py"
TRACE_AUTH_T = SEC + "test_trace_auth.py"
SERIES_T = CTL + "trace/test_trace_series_route.py"
HOSTILE_T = SEC + "test_hostile_fields.py"
API_T = CTL + "api/test_http_api.py"
INGRESS = "control/fleet/ingress.py"
SMALL_T = SEC + "test_small_parsing.py"
REPLICA_ID_T = SMALL_T + "::test_a_replica_id_the_fleet_does_not_have_is_a_400_naming_the_header"
FLEET_FWD_T = CTL + "fleet/test_fleet_forward.py"

ROUTES_MUTANTS: list[Mutant] = [
    Mutant("trace-bound-token-unscoped", TRACE_R, "        if who.bound:  # TEMP views",
           "        if False:  # TEMP views", (TENANT_T,),
           "a token bound to tenant acme reads every tenant's requests"),
    Mutant("trace-config-changes-to-bound", TRACE_R,
           '    require_unbound(who, UNBOUND_ONLY["config_changes"])\n', "",
           (TENANT_T, TRACE_AUTH_T),
           "a tenant-bound token reads the server's config history"),
    Mutant("trace-loadtest-runs-to-bound", TRACE_R,
           '    require_unbound(who, UNBOUND_ONLY["loadtest_runs"])\n', "",
           (TENANT_T, TRACE_AUTH_T), "a tenant-bound token reads every load test's runs"),
    Mutant("trace-checklist-to-bound", TRACE_R,
           '    require_unbound(who, UNBOUND_ONLY["checklist_facts"])\n', "",
           (TENANT_T, TRACE_AUTH_T),
           "a tenant-bound token reads the go-live checklist's facts (every tenant's)"),
    Mutant("trace-loadtest-stats-to-bound", TRACE_R,
           '    require_unbound(who, UNBOUND_ONLY["loadtest_stats"])\n', "",
           (TENANT_T, TRACE_AUTH_T), "a tenant-bound token reads load-test length spreads"),
    Mutant("trace-results-by-reader", TRACE_R,
           'who = caller(request, get_state(request).control_tokens, "admin")',
           'who = caller(request, get_state(request).control_tokens, "read")',
           (TRACE_AUTH_T + "::test_the_results_route_checks_the_admin_scope_itself_behind"
            "_the_guard",),
           "a read-only (Grafana) token writes load-test results into the trace the"
           " checklist trusts"),
    Mutant("trace-series-by-anywhere", TRACE_R,
           '    if by is not None and kind != "latency":\n', "    if False:\n",
           (SERIES_T,), "GET /v1/trace/series/steps?by=lane answers a 500"),
    Mutant("trace-results-wrong-type-500", TRACE_R,
           "except (TypeError, ValueError, duckdb.Error) as exc:",
           "except duckdb.Error as exc:",
           (TRACE_AUTH_T + "::test_results_with_a_value_of_the_wrong_type_are_a_400_and_store"
            "_nothing",),
           "load-test results with a string where a number goes answer a 500"),
    Mutant("api-stop-token-id-at-vocab-size", API_R, "if not 0 <= t < vocab_size}",
           "if not 0 <= t <= vocab_size}", (HOSTILE_T,),
           "stop_token_ids [vocab_size] passes the edge and fails the whole batch's step"),
    Mutant("api-logit-bias-ids-unchecked", API_R,
           '("stop_token_ids", body.stop_token_ids or ()), ("logit_bias", bias)',
           '("stop_token_ids", body.stop_token_ids or ()),', (HOSTILE_T,),
           "a logit_bias key past the vocabulary fails every request in the step"),
    Mutant("api-prompt-ids-unbounded", API_R,
           "        check_prompt_ids(len(body.prompt), state.parts.static.max_model_len)\n",
           "        pass\n", (HOSTILE_T, CTL + "api/test_arrival_limits.py"),
           "a prompt of a million token ids is copied and checked id by id before it is"
           " refused as too long"),
    Mutant("api-chat-chars-unbounded", API_R,
           '    _check_prompt_chars(state, sum(len(m["content"]) for m in messages), "messages")\n',
           "", (HOSTILE_T,),
           "a 100 MB chat message goes through the chat template and the tokenizer before"
           " it is refused"),
    Mutant("api-top-k-minus-one-passed", API_R, "top_k=max(0, body.top_k or 0)",
           "top_k=body.top_k or 0",
           (CTL + "api/test_sampling_fields.py::test_top_k_minus_one_is_off_as_in_vllm",),
           "top_k=-1 (vLLM's 'no top-k') is refused with a 400"),
    Mutant("api-loading-no-retry-after", API_R,
           'code="loading", headers=retry_after(LOADING_RETRY_AFTER_S))', 'code="loading")',
           (API_T, CTL + "api/test_errors.py"),
           "a client told 503 while the model loads gets no Retry-After and retries at once"),
    Mutant("ingress-replica-id-one-past", INGRESS, "or int(named) >= len(self.handles):",
           "or int(named) > len(self.handles):", (REPLICA_ID_T,),
           "X-Batchpilot-Replica: 2 on a 2-replica fleet answers a 500 (IndexError)"),
    Mutant("ingress-replica-header-twice", INGRESS,
           "if len(sent) > 1 or not (named.isascii()", "if not (named.isascii()", (REPLICA_ID_T,),
           "two X-Batchpilot-Replica headers: the first wins silently where a proxy may have"
           " added the second"),
    Mutant("ingress-replica-id-any-length", INGRESS,
           "named.isdecimal() and len(named) <= 6)", "named.isdecimal())", (REPLICA_ID_T,),
           "a 5,000-digit replica id answers a 500 (int() refuses it)"),
    Mutant("ingress-scaled-in-replica-called", INGRESS,
           "        if not self.scaling.callable(int(named)):", "        if False:",
           (CTL + "fleet/test_fleet_scaling_local.py",),
           "a request naming a scaled-in replica makes Serve start it again"),
    Mutant("ingress-ready-while-draining", INGRESS,
           "return not self.draining and any(v.healthy", "return any(v.healthy",
           (FLEET_FWD_T + "::test_a_draining_fleet_is_not_ready_though_its_replicas_are",),
           "a draining fleet says ready: its load balancer keeps sending it requests"),
    Mutant("ingress-tenant-ignores-user", INGRESS,
           'tenant = headers.get("x-tenant") or body.get("user") or "default"',
           'tenant = headers.get("x-tenant") or "default"',
           (FLEET_FWD_T + "::test_an_openai_user_keys_affinity_as_an_x_tenant_header_does",),
           "an OpenAI client's `user` no longer keeps its requests on one replica's cache"),
]
