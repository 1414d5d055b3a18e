"""The fleet's control routes, canary rules, replicas' drain and retirement, ASGI calls,
autoscale and restart CLIs, and the edge proxy (pass of 2026-12-07); each has a test that
fails on it."""

from __future__ import annotations

from mutant_spec import CTL, SEC, Mutant

FLEET_CONTROL_MUTANTS: list[Mutant] = [
    Mutant("fleet-drain-any-replica-ok", "control/fleet/control_routes.py",
           'ok = all(r["status"] == 200',
           'ok = any(r["status"] == 200',
           (CTL + "fleet/test_fleet_control_plane.py::test_a_drain_one_replica_missed_is"
                  "_mixed_and_a_draining_fleet_says_so",),
           "POST /control/drain answers 200 draining while a replica kept admitting"
           " requests"),
    Mutant("fleet-config-admission-always-open", "control/fleet/control_routes.py",
           '"admission": "draining" if fleet.draining else "open",',
           '"admission": "open",',
           (CTL + "fleet/test_fleet_control_plane.py::test_a_drain_one_replica_missed_is"
                  "_mixed_and_a_draining_fleet_says_so",),
           "GET /control/config says admission open while the fleet drains for"
           " shutdown"),
    Mutant("fleet-readyz-no-retry-after", "control/fleet/ingress_app.py",
           'headers=None if ok else {"Retry-After": "5"})',
           "headers=None)",
           (CTL + "fleet/test_fleet_control_plane.py::test_a_drain_one_replica_missed_is"
                  "_mixed_and_a_draining_fleet_says_so",),
           "a fleet that is not ready answers /readyz 503 without Retry-After"),
    Mutant("fleet-draining-no-retry-after", "control/fleet/ingress_app.py",
           'raise APIError(503, "the fleet is draining (shutting down)",'
           ' code="draining",\n                           headers={"Retry-After":'
           ' "1"})',
           'raise APIError(503, "the fleet is draining (shutting down)",'
           ' code="draining")',
           (CTL + "fleet/test_fleet_control_plane.py::test_a_drain_one_replica_missed_is"
                  "_mixed_and_a_draining_fleet_says_so",),
           "a draining fleet's 503 tells clients no Retry-After, so they do not"
           " back off"),
    Mutant("fleet-canary-read-without-control-api", "control/fleet/control_routes.py",
           '        caller(request, "read")\n        return {"canary": control',
           '        return {"canary": control',
           (CTL + "fleet/test_fleet_control_plane.py::test_a_fleet_without_its_control_api"
                  "_has_no_control_route",),
           "GET /control/canary answers on a fleet run with --no-control-api (and"
           " skips its check)"),
    Mutant("fleet-canary-min-requests-ignored", "control/fleet/control_routes.py",
           '{"min_requests": body.min_requests})).validate()',
           "{})).validate()",
           (CTL + "fleet/test_fleet_control_plane.py::test_a_canary_takes_its_own_min"
                  "_requests_and_a_poll_period_from_its_window",),
           "a canary's min_requests is ignored: a low-traffic canary extends and"
           " rolls back"),
    Mutant("fleet-canary-poll-every-swapped", "control/fleet/canary_run.py",
           "return min(max(watch_s / 10, 1.0), 15.0)",
           "return max(min(watch_s / 10, 1.0), 15.0)",
           (CTL + "fleet/test_fleet_control_plane.py::test_a_canary_takes_its_own_min"
                  "_requests_and_a_poll_period_from_its_window",),
           "every canary compares its window only every 15 s, deciding a short"
           " canary late"),
    Mutant("fleet-canary-named-replica-accepted", "control/fleet/control_routes.py",
           "    async def canary(request: Request, body: CanaryBody) ->"
           " JSONResponse:\n        refuse_named(request)",
           "    async def canary(request: Request, body: CanaryBody) ->"
           " JSONResponse:",
           (CTL + "fleet/test_fleet_control_plane.py::test_a_canary_is_refused_on_a_named"
                  "_replica_or_without_a_healthy_baseline",),
           "POST /control/canary with X-Batchpilot-Replica starts a fleet canary"
           " instead of a 409"),
    Mutant("fleet-canary-without-healthy-baseline", "control/fleet/canary_run.py",
           "if len(healthy) < replicas + 1:",
           "if len(healthy) < replicas:",
           (CTL + "fleet/test_fleet_control_plane.py::test_a_canary_is_refused_on_a_named"
                  "_replica_or_without_a_healthy_baseline",),
           "a canary starts with every baseline replica down: nothing to compare it"
           " with"),
    Mutant("fleet-retired-replica-polls-ready", "control/fleet/replica.py",
           "problem = RETIRED if self.retired else engine.health()",
           "problem = engine.health()",
           (CTL + "fleet/test_fleet_replica_retire.py::test_a_retired_replica_polls_not"
                  "_ready_and_fails_its_health_check",),
           "a replica a rolling restart retired still polls ready and is routed"
           " requests"),
    Mutant("fleet-replica-drain-reports-zero", "control/fleet/replica.py",
           "            await self._wait_idle(ABORT_FLUSH_S)\n        return left",
           "            await self._wait_idle(ABORT_FLUSH_S)\n        return"
           " self.state.inflight",
           (CTL + "fleet/test_fleet_replica_retire.py::test_a_drain_counts_the_requests_it"
                  "_had_to_abort",),
           "shutdown and restarts report 0 aborted requests when some were cut off"),
    Mutant("fleet-autoscale-cli-oldest-events", "control/fleet/autoscale_cli.py",
           'for e in state["events"][-EVENTS_SHOWN:]:',
           'for e in state["events"][:EVENTS_SHOWN]:',
           (CTL + "fleet/test_fleet_autoscale_cli.py::test_it_shows_the_latest_scale"
                  "_events_not_the_first",),
           "batchpilot fleet autoscale shows the first scale events ever, never the"
           " recent ones"),
    Mutant("fleet-autoscale-change-not-in-history", "control/fleet/scaling_routes.py",
           '        if versions is not None:\n            versions.event("autoscale'
           '_config", **event)\n',
           "",
           (CTL + "fleet/test_fleet_scaling_local.py::test_the_autoscale_settings_change"
                  "_live_and_refuse_what_they_cannot_be",),
           "an autoscale rule change leaves no audit event in GET /control/history"),
    Mutant("fleet-restart-cli-timeout-is-grace", "control/fleet/restart_cli.py",
           '"ready_timeout_s": args.timeout,',
           '"ready_timeout_s": args.grace,',
           (CTL + "fleet/test_fleet_restart.py::test_the_cli_sends_its_grace_timeout_and"
                  "_replicas_as_given",),
           "fleet restart --timeout is ignored: a replica gets only --grace seconds"
           " to come back"),
    Mutant("fleet-asgi-no-disconnect", "control/fleet/asgi_call.py",
           "            if not complete:\n                gone.set()",
           "            if False:\n                gone.set()",
           (CTL + "fleet/test_fleet_asgi_call.py::test_a_consumer_that_stops_early_is_a"
                  "_disconnect_the_app_sees",),
           "a fleet client that leaves mid-stream is not seen as gone: its request"
           " keeps its KV"),
    Mutant("fleet-asgi-query-dropped", "control/fleet/asgi_call.py",
           '"query_string": query,',
           '"query_string": b"",',
           (CTL + "fleet/test_fleet_asgi_call.py::test_the_query_string_reaches_the_app",),
           "every ?query sent through the fleet is lost at the replica (trace"
           " filters, limits)"),
    Mutant("fleet-slots-not-max-replicas", "control/fleet/app.py",
           "            if self.autoscale.max_replicas != self.replicas:",
           "            if self.autoscale.max_replicas > self.replicas:",
           (CTL + "fleet/test_fleet_placement.py::test_an_autoscaled_fleet_deploys_exactly"
                  "_its_max_replicas_slots",),
           "an autoscaled fleet deploys slots its rule never runs (GPUs held for"
           " nothing)"),
    Mutant("fleet-torch-threads-ceil", "control/fleet/app.py",
           "return max(1, math.floor(replica_cpus) - 1)",
           "return max(1, math.ceil(replica_cpus) - 1)",
           (CTL + "fleet/test_fleet_placement.py::test_a_cpu_replica_runs_one_torch_thread"
                  "_fewer_than_its_whole_cpus",),
           "a 2.5-CPU replica spins 2 torch threads beside its event loop on 2 cores"),
    Mutant("autoscale-signals-stale-after-clock-step", "control/fleet/autoscale_board.py",
           "if cached is None or now - cached[0] > READ_CACHE_S or cached[0] > now:",
           "if cached is None or now - cached[0] > READ_CACHE_S:",
           (CTL + "fleet/test_fleet_autoscale_rule.py::test_the_policy_reads_fresh_signals"
                  "_after_the_clock_steps_back",),
           "after the clock steps back, autoscaling acts on stale signals for as"
           " long as the step"),
    Mutant("fleet-cli-autoscale-flags-dropped", "control/fleet/cli.py",
           "return args.max_replicas, base.validate().replace(changes)",
           "return args.max_replicas, base.validate()",
           (CTL + "fleet/test_fleet_size.py::test_an_autoscaled_fleet_starts_from_one"
                  "_replica_and_takes_its_settings",),
           "batchpilot fleet --autoscale NAME=VALUE is silently ignored"),
    Mutant("fleet-cli-default-min-two", "control/fleet/cli.py",
           "base = AutoscaleConfig(1 if args.min_replicas is None",
           "base = AutoscaleConfig(2 if args.min_replicas is None",
           (CTL + "fleet/test_fleet_size.py::test_an_autoscaled_fleet_starts_from_one"
                  "_replica_and_takes_its_settings",),
           "--max-replicas 2 alone never scales down: min defaults to 2, not 1"),
    Mutant("edge-chat-message-count-unchecked", "control/edge/app.py",
           "        check_messages(len(body.messages), limits)\n        return await"
           ' forward(request)\n\n    @app.post("/tokenize")',
           '        return await forward(request)\n\n    @app.post("/tokenize")',
           (SEC + "test_edge_process.py::test_the_edge_refuses_too_many_chat_messages"
                  "_without_asking_the_server",),
           "a chat request over max_messages reaches the engine's process behind"
           " the edge"),
    Mutant("edge-tokenize-chat-count-unchecked", "control/edge/app.py",
           "        if chat:\n            check_messages(len(body.messages), limits)",
           "",
           (SEC + "test_edge_process.py::test_the_edge_refuses_too_many_chat_messages"
                  "_without_asking_the_server",),
           "a chat /tokenize over max_messages reaches the engine's process behind"
           " the edge"),
    Mutant("edge-exit-0-never-listened", "control/edge/__main__.py",
           "return 0 if server.started else 1",
           "return 0",
           (SEC + "test_edge_process.py::test_an_edge_that_could_not_listen_exits_non_zero",),
           "an edge that never listened (port taken) exits 0, read as a clean stop"),
]
