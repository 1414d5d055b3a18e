"""The fleet's trace fan-out and request relay (pass of 2026-12-07, late: each had one planted
bug); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, SEC, Mutant

FANOUT = "control/fleet/trace_fanout.py"
RELAY = "control/fleet/forward.py"
TENANT_T = SEC + "test_tenant_tokens.py::"
FLEET_AUTH_T = TENANT_T + "test_the_fleet_ingress_needs_a_token_for_every_trace_route"
FLEET_BOUND_T = TENANT_T + "test_a_bound_token_at_the_fleet_sees_its_tenant_only"
FANOUT_T = CTL + "fleet/test_fleet_trace_fanout.py::"
NAMED_T = FANOUT_T + "test_a_named_replica_answers_its_own_trace_only"
NAMED_DOWN_T = FANOUT_T + "test_a_named_replica_that_is_down_is_a_503_never_another_replicas_trace"
REPLICA_500_T = FANOUT_T + "test_a_replica_answering_500_fails_the_read_as_a_502_naming_it"
ONE_REPLICA_T = FANOUT_T + "test_a_request_is_found_on_the_one_replica_that_ran_it"
WINDOW_T = FANOUT_T + "test_a_row_questions_window_reaches_every_replica"
RESULTS_T = FANOUT_T + "test_load_test_results_need_an_admin_token_however_the_path_is_spelled"
ROUTED_T = CTL + "api/test_routed_header.py::test_the_ingress_drops_a_clients_routing_header"
FORWARD_T = CTL + "fleet/test_fleet_forward.py::"
DYING_T = FORWARD_T + "test_a_stream_cut_by_a_dying_replica_ends_with_an_error_chunk"
RELAY_T = CTL + "fleet/test_fleet_relay.py::"
HOST_T = RELAY_T + "test_a_fleet_on_a_public_name_reaches_replicas_that_listen_on_loopback"
CHARSET_T = RELAY_T + "test_a_stream_in_the_servers_own_content_type_ends_with_an_error_chunk"
SHAPE_T = RELAY_T + "test_a_stream_cut_before_its_first_chunk_ends_in_its_own_shape"
STATUS_T = RELAY_T + "test_a_replicas_error_status_and_headers_reach_the_client_as_it_said_them"
LATE_T = RELAY_T + "test_a_replica_that_takes_no_request_in_time_is_cancelled_and_called_late"
ACCEPTED_T = RELAY_T + "test_a_replica_that_fails_after_taking_a_request_is_a_502_never_a_retry"
METRICS_T = RELAY_T + "test_the_fleets_metrics_answer_while_a_replica_does_not"
FAN_OUT_T = (RELAY_T + "test_a_fan_out_calls_only_the_replicas_it_is_given_each_with_body"
             "_and_headers")

FLEET_RELAY_MUTANTS: list[Mutant] = [
    # ---- control/fleet/trace_fanout.py: who may read, and the fleet's answer ----
    Mutant("fanout-reads-without-a-token", FANOUT,
           'who = caller(request, fleet.control_tokens, "read")  # before anything else',
           'who = caller(request, (), "read")  # before anything else', (FLEET_AUTH_T,),
           "anyone without a token reads every replica's trace through the ingress"),
    Mutant("fanout-unbound-only-to-bound", FANOUT,
           "        if question in UNBOUND_ONLY:\n"
           "            require_unbound(who, UNBOUND_ONLY[question])\n", "", (FLEET_AUTH_T,),
           "a tenant-bound token reads the fleet's config audit and go-live checklist"),
    Mutant("fanout-bound-tenants-dropped", FANOUT,
           "tenants = who.tenants if bound and who is not None else None",
           "tenants = None", (FLEET_BOUND_T,),
           "a token bound to tenant acme reads every tenant's requests at the fleet"),
    Mutant("fanout-authorization-not-relayed", FANOUT,
           "    auth = _authorization(request)\n", "    auth: Headers = []\n",
           (FLEET_BOUND_T,),
           "every trace read at a fleet whose replicas check tokens answers 401"),
    Mutant("fanout-named-replica-ignored", FANOUT,
           "        if request.headers.get(REPLICA_HEADER) is not None:\n"
           "            return await fleet.forward(request, b\"\", fleet.named_replica(request),"
           "\n                                       retry=False)\n", "", (NAMED_T,),
           "X-Batchpilot-Replica: 1 answers every replica's rows, not replica 1's"),
    Mutant("fanout-named-replica-retried-elsewhere", FANOUT,
           "                                       retry=False)",
           "                                       retry=True)", (NAMED_DOWN_T,),
           "a trace read of replica 1 while it is down answers another replica's trace as"
           " if it were replica 1's"),
    Mutant("fanout-replica-500-not-502", FANOUT,
           "if status == 0 or status >= 500]", "if status == 0 or status > 500]",
           (REPLICA_500_T,),
           "a replica's 500 fails the fleet's trace read as the ingress's own 500, without"
           " Retry-After"),
    Mutant("fanout-request-on-one-replica-404", FANOUT,
           'found_ok=question == "request"', "found_ok=False", (ONE_REPLICA_T,),
           "GET /v1/trace/requests/ID at a fleet answers 404 for every request (each ran"
           " on one replica; the others do not have it)"),
    Mutant("fanout-row-query-not-relayed", FANOUT,
           'query = request.scope.get("query_string", b"")', 'query = b""', (WINDOW_T,),
           "/v1/trace/slow?since=... at a fleet answers requests from outside the window"),
    Mutant("fanout-relay-bound-unchecked", FANOUT,
           '        require_unbound(caller(request, tokens, "read"), f"{request.url.path}'
           ' (relayed to one"\n                        " replica as is, not scoped to its'
           ' tenants)")\n', '        caller(request, tokens, "read")\n', (FLEET_AUTH_T,),
           "a tenant-bound token exports every tenant's rows of a replica's trace"),
    Mutant("fanout-guard-results-by-reader", FANOUT,
           'caller(request, tokens, "admin")', 'caller(request, tokens, "read")',
           (RESULTS_T,),
           "a read-only token writes load-test results through a spelling of the path the"
           " front door's own check does not match"),
    Mutant("fanout-guard-trailing-slash", FANOUT,
           'path = re.sub(r"/+", "/", request.url.path).rstrip("/").lower()',
           'path = re.sub(r"/+", "/", request.url.path).lower()', (RESULTS_T,),
           "POST /v1/loadtest/results/ passes the ingress's admin check with a read token"),
    # ---- control/fleet/forward.py: headers up, answers and errors back, fan-out ----
    Mutant("relay-client-routed-header-passed", RELAY,
           'b"transfer-encoding",\n               ROUTED_HEADER.encode()}',
           'b"transfer-encoding"}', (ROUTED_T,),
           "a client writes the routing decision the replica's trace records"),
    Mutant("relay-client-host-passed", RELAY,
           'HOP_HEADERS = {b"host", b"content-length"', 'HOP_HEADERS = {b"content-length"',
           (HOST_T,),
           "every request to a fleet on a public name is refused 421 by its replicas on"
           " loopback"),
    Mutant("relay-sse-with-charset-not-seen", RELAY,
           'v.startswith("text/event-stream")', 'v == "text/event-stream"', (CHARSET_T,),
           "a stream whose replica dies ends without an error chunk or [DONE] (the server"
           " sends text/event-stream; charset=utf-8)"),
    Mutant("relay-chat-error-chunk-as-completion", RELAY,
           'obj = last.get("object") or ("chat.completion.chunk" if chat else'
           ' "text_completion")', 'obj = last.get("object") or "text_completion"',
           (SHAPE_T,),
           "a chat stream that dies before its first token ends in a completions chunk"
           " the client's chat parser does not read"),
    Mutant("relay-status-always-200", RELAY,
           'status_code=start["status"]', "status_code=200", (STATUS_T,),
           "a replica's 400 or 429 reaches the client as 200 with an error body"),
    Mutant("relay-late-replica-not-cancelled", RELAY,
           "    except asyncio.TimeoutError:\n        gen.cancel()\n",
           "    except asyncio.TimeoutError:\n", (LATE_T,),
           "a request a busy replica took late runs there and on the replica it was"
           " retried on"),
    Mutant("relay-late-replica-marked-down", RELAY,
           ' s", late=True) from None', ' s") from None', (LATE_T,),
           "one request a busy replica takes over 3 s to accept marks it down"),
    Mutant("relay-failed-after-accept-retried", RELAY,
           "        raise replica_failed(replica_id, exc) from None",
           '        raise NotAccepted(f"{type(exc).__name__}: {exc}") from None',
           (ACCEPTED_T,),
           "a request a replica accepted and then failed runs again on another replica"),
    Mutant("relay-fan-out-one-down-fails-all", RELAY,
           "        try:\n"
           "            return (i, *await _collect(handles[i], method, path, body, headers))\n"
           "        except Exception as exc:  # down or restarting\n"
           "            return i, 0, repr(exc).encode()\n",
           "        return (i, *await _collect(handles[i], method, path, body, headers))\n",
           (METRICS_T,), "one replica restarting makes the fleet's /metrics a 500"),
    Mutant("relay-fan-out-wakes-scaled-in", RELAY,
           "(one(i) for i in ids)", "(one(i) for i in range(len(handles)))", (FAN_OUT_T,),
           "a /metrics scrape or a drain calls the replicas autoscaling scaled in (Serve"
           " starts them again)"),
    Mutant("relay-fan-out-drops-headers", RELAY,
           'method, path, b"", headers or [], body)', 'method, path, b"", [], body)',
           (FAN_OUT_T,),
           "POST /control/drain reaches replicas with tokens without the caller's"
           " Authorization: every one refuses it"),
    Mutant("relay-stream-error-no-done", RELAY,
           '            yield b"data: [DONE]\\n\\n"\n', "", (DYING_T,),
           "a client's stream cut by a dying replica never ends with [DONE]"),
]
