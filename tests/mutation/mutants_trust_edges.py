"""Mutants for the request edge and the tenants' boundaries: the origin guard, a request's routing
metadata and text checks, the request schemas and answer format, a live config patch, the read
deadlines and the tenants' lane shares (pass of 2026-12-08: each module had at most two planted
bugs); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, SEC, Mutant

OG = "control/admin/origin_guard.py"
RM = "control/api/request_meta.py"
TC = "control/api/text_check.py"
SC = "control/api/schemas.py"
OF = "control/api/openai_format.py"
PT = "engine/config/patch.py"
RD = "control/serve/read_deadlines.py"
TN = "engine/lanes/tenants.py"

GUARD = SEC + "test_origin_guard_edges.py"
LOOPBACK_T = GUARD + "::test_a_name_that_only_begins_like_loopback_is_a_421"
HOST_LIST_T = GUARD + "::test_a_host_holding_a_list_without_spaces_is_a_400"
ORIGIN_T = GUARD + "::test_an_origin_of_another_server_or_null_is_a_403"
MEDIA_T = GUARD + "::test_a_change_a_page_can_send_without_cors_is_a_415"
METHODS_T = GUARD + "::test_every_changing_method_is_checked"
TOKENS_T = GUARD + "::test_each_token_is_ruled_on_before_the_body_is_read"
DOOR_T = SEC + "test_control_door.py"
TWICE_DOOR_T = DOOR_T + "::test_x_priority_wins_over_the_body_and_a_routing_header_twice_is_a_400"

EDGES = CTL + "api/test_request_edges.py"
PRIORITY_T = EDGES + "::test_x_priority_is_exactly_32_bits"
DEADLINE_T = EDGES + "::test_a_deadline_is_milliseconds_after_arrival_on_the_engine_clock"
TIMEOUT_T = EDGES + "::test_a_timeout_is_milliseconds_capped_by_the_server"
LANE_T = EDGES + "::test_a_lane_header_is_a_name_checked_like_a_tenant"
TENANT_T = EDGES + "::test_x_tenant_wins_over_the_bodys_user"
UTF8_T = EDGES + "::test_a_utf8_header_is_read_as_utf8"
RETRY_T = EDGES + "::test_a_retry_count_of_0_is_a_first_send"
TWICE_T = EDGES + "::test_each_routing_header_sent_twice_is_a_400_naming_it"
ESCAPE_T = EDGES + "::test_a_surrogate_escape_in_any_case_or_half_is_refused"
NESTED_T = EDGES + "::test_a_lone_surrogate_in_a_key_or_a_nested_list_is_named"
ANY_METHOD_T = EDGES + "::test_a_body_sent_by_any_changing_method_is_checked"
CHUNK_T = EDGES + "::test_a_surrogate_in_a_later_chunk_is_refused_and_a_good_body_arrives_whole"
DISCONNECT_T = EDGES + "::test_a_disconnect_met_while_reading_reaches_the_route"

FORMAT = CTL + "api/test_request_edges_format.py"
BOUNDS_T = FORMAT + "::test_a_sampling_field_is_bounded_at_both_ends"
LOGPROBS_T = FORMAT + "::test_logprobs_alternatives_are_at_most_20_and_top_logprobs_needs_logprobs"
USAGE_T = FORMAT + "::test_usage_counts_the_prompt_in_the_total"
CONTINUOUS_T = FORMAT + "::test_usage_on_every_chunk_only_when_continuous_usage_was_asked"
NOT_LAST_T = FORMAT + "::test_a_choice_that_is_not_the_last_ends_with_its_finish_chunk_only"
HELD_BACK_T = FORMAT + "::test_held_back_tokens_logprobs_come_with_the_finish_chunk"
HEADERS_T = FORMAT + "::test_headers_carry_a_tenant_in_any_script_and_the_engines_final_lane"
SLO_T = FORMAT + "::test_the_admitted_lanes_own_slo_is_the_answers"

PATCH = ENG + "test_config_patch.py"
INVALID_T = PATCH + "::test_an_invalid_change_names_its_field"
ROUND_TRIP_T = PATCH + "::test_round_trip_and_diff"
REPLAY_T = PATCH + "::test_a_recorded_diff_replayed_gives_the_config_it_was_taken_from"
BOOK = ENG + "test_patch_and_tenants_edges.py"
KEEPS_T = BOOK + "::test_a_patch_of_another_setting_keeps_every_tenants_lane_and_the_version"
STATIC_T = BOOK + "::test_a_static_setting_is_refused_as_one_that_needs_a_restart"
LEAVES_T = BOOK + "::test_a_tenant_that_leaves_leaves_nothing_whichever_way_it_goes"
LEAD_T = BOOK + "::test_a_tenant_ahead_keeps_its_lead_while_it_runs_or_is_preempted"
NEWCOMER_T = BOOK + "::test_a_newcomer_joins_at_the_highest_reached_when_nobody_is_queued"
FLOOR_T = BOOK + "::test_the_floor_rises_when_the_tenant_furthest_behind_leaves_the_queue"
REBUILT_T = BOOK + "::test_a_fair_lanes_rebuilt_queue_keeps_the_virtual_times"

READS = SEC + "test_read_deadlines.py"
NOTHING_T = READS + "::test_a_connection_that_sends_nothing_is_closed"
BIG_BODY_T = READS + "::test_headers_under_the_limit_with_a_big_body_in_the_same_reads_pass"
ON_TIME_T = READS + "::test_a_request_on_time_keeps_its_connection_while_its_answer_takes_long"
NEVER_T = READS + "::test_a_body_that_never_arrives_gets_a_408"
READS_EDGES = CTL + "serve/test_read_deadlines_edges.py"
NEXT_HEAD_T = READS_EDGES + "::test_a_kept_alive_connections_next_request_gets_a_header_deadline"
OWN_LIMIT_T = READS_EDGES + "::test_each_request_on_a_kept_alive_connection_has_its_own_head_limit"
CLOSES_T = READS_EDGES + "::test_a_body_that_never_arrives_gets_a_408_and_the_connection_closes"

TRUST_EDGES_MUTANTS: list[Mutant] = [
    # ---- the origin guard (control/admin/origin_guard.py) -------------------------------
    Mutant("og-loopback-prefix", OG, "_hostname(host) not in LOOPBACK_NAMES",
           "not _hostname(host).startswith(LOOPBACK_NAMES)", (LOOPBACK_T,),
           "a page on localhost.evil.example (rebound to 127.0.0.1) reads and steers a"
           " tokenless server"),
    Mutant("og-host-list-comma", OG, '", \\t/@?#\\\\"', '" \\t/@?#\\\\"', (HOST_LIST_T,),
           "a Host of 'localhost:8000,evil.example' passes as loopback while a proxy may"
           " route by the other name"),
    Mutant("og-origin-null-passes", OG, "_authority(origin) != (host or \"\").lower()",
           "_authority(origin) not in (None, (host or \"\").lower())", (ORIGIN_T,),
           "a sandboxed page or a file:// page (Origin: null) drains or reconfigures the"
           " server"),
    Mutant("og-origin-port-ignored", OG, "_authority(origin) != (host or \"\").lower()",
           "_hostname(_authority(origin) or \"\") != _hostname(host or \"\")", (ORIGIN_T,),
           "a page served by another local server (localhost:3000) changes the control plane"),
    Mutant("og-json-substring", OG, 'if media_type != "application/json":',
           'if "json" not in headers.get("content-type", "").lower():', (MEDIA_T,),
           "a page's no-CORS POST as 'text/plain; x=json' reaches the control routes"),
    Mutant("og-only-post-checked", OG,
           "        if method in SAFE_METHODS:\n            return None",
           '        if method != "POST":\n            return None', (METHODS_T,),
           "a PATCH or DELETE of the control plane skips the Origin and Content-Type checks"),
    Mutant("og-loadtest-read-scope", OG,
           'path.startswith(("/control/", "/v1/loadtest/"))', 'path.startswith("/control/")',
           (TOKENS_T,), "a read token's load-test results body is read and parsed before its"
           " 403 (a caller learns what the route expects)"),
    Mutant("og-bound-token-reads", OG,
           '                require_unbound(who, f"{path} (the server\'s config, its history'
           ' or a change)")\n', "", (TOKENS_T,),
           "a token bound to one tenant reaches every control route's body reading, where"
           " only the route's own check stands between it and every tenant's config"),
    # ---- a request's routing metadata (control/api/request_meta.py) ---------------------
    Mutant("rm-x-priority-one-over", RM, "-PRIORITY_LIMIT, PRIORITY_LIMIT - 1)",
           "-PRIORITY_LIMIT, PRIORITY_LIMIT)", (PRIORITY_T,),
           "X-Priority 2**31 is accepted and overflows the engine's 32-bit priority"),
    Mutant("rm-deadline-in-seconds", RM, "deadline = now + deadline_ms / 1000.0",
           "deadline = now + deadline_ms", (DEADLINE_T,),
           "X-Deadline-Ms 500 gives the request 500 s, not half a second: it is never shed"),
    Mutant("rm-deadline-wrong-clock", RM, "deadline = now + deadline_ms / 1000.0",
           'deadline = __import__("time").monotonic() + deadline_ms / 1000.0', (DEADLINE_T,),
           "a deadline on the monotonic clock, read against the engine's time.time(): every"
           " request with X-Deadline-Ms is already late"),
    Mutant("rm-timeout-raises-the-cap", RM,
           "timeout_s = max_timeout_s if timeout_ms is None else min(",
           "timeout_s = max_timeout_s if timeout_ms is None else max(", (TIMEOUT_T,),
           "a client's X-Request-Timeout-Ms outlives the server's cap and can never shorten it"),
    Mutant("rm-timeout-in-seconds", RM, "min(timeout_ms / 1000.0,", "min(timeout_ms,",
           (TIMEOUT_T,), "X-Request-Timeout-Ms 500 waits 500 s (up to the cap), not 0.5 s"),
    Mutant("rm-lane-unchecked", RM, 'lane = _name(_utf8(_one(headers, "X-Lane")), "X-Lane")',
           'lane = _utf8(_one(headers, "X-Lane"))', (LANE_T,),
           "an X-Lane of any length or with control characters reaches the engine, its logs"
           " and its metric labels"),
    Mutant("rm-body-user-wins", RM,
           '(_name(_utf8(_one(headers, "X-Tenant")), "X-Tenant") or _name(user, "user")',
           '(_name(user, "user") or _name(_utf8(_one(headers, "X-Tenant")), "X-Tenant")',
           (TENANT_T,), "a client's body `user` overrides its gateway's X-Tenant: it picks"
           " another tenant's share and prefix-cache domain"),
    Mutant("rm-utf8-undecoded", RM, 'return value.encode("latin-1").decode("utf-8")',
           "return value", (UTF8_T,),
           "a gateway's UTF-8 tenant name becomes mojibake: its own tenant's metrics and"
           " prefix cache are split from it"),
    Mutant("rm-retry-zero-is-resend", RM, "resent=bool(retries))",
           "resent=retries is not None)", (RETRY_T,),
           "every first send of the OpenAI SDK (retry count 0) is counted as a resend"),
    Mutant("rm-two-copies-pass", RM, "    if len(values) > 1:", "    if len(values) > 2:",
           (TWICE_T, TWICE_DOOR_T), "a gateway that appends its X-Tenant after the client's"
           " leaves the client's in force"),
    # ---- the text check at the door (control/api/text_check.py) -------------------------
    Mutant("tc-upper-escape-missed", TC, 'rb"\\\\u[dD][89a-fA-F]|NaN|Infinity"',
           'rb"\\\\ud[89a-f]|NaN|Infinity"', (ESCAPE_T,),
           "a lone surrogate spelt \\uD800 passes the door and raises in the tokenizer or in"
           " the engine's step"),
    Mutant("tc-low-half-missed", TC, 'rb"\\\\u[dD][89a-fA-F]|NaN|Infinity"',
           'rb"\\\\u[dD][89abAB]|NaN|Infinity"', (ESCAPE_T,),
           "a lone low surrogate (\\udc00-\\udfff) passes the door and raises past it"),
    Mutant("tc-keys-unchecked", TC,
           "                if not _encodes(key):\n"
           '                    return f"{path} (a key)", "text"\n', "", (NESTED_T,),
           "a surrogate in a key passes and raises where the ignored field is named in a"
           " header"),
    Mutant("tc-lists-not-walked", TC, "elif isinstance(item, list):",
           "elif isinstance(item, tuple):", (NESTED_T,),
           "a surrogate in a message's content list reaches the chat template"),
    Mutant("tc-only-post-checked", TC, 'scope["method"] in ("GET", "HEAD", "OPTIONS")',
           'scope["method"] != "POST"', (ANY_METHOD_T,),
           "a PATCH of the config with a surrogate in its reason reaches the history's writer"),
    Mutant("tc-first-chunk-only", TC, "error = _refusal(body)", "error = _refusal(chunks[0])",
           (CHUNK_T,), "a surrogate past the first chunk of a large body passes the door"),
    Mutant("tc-disconnect-lost", TC, "        pending.append(last)\n", "        pass\n",
           (DISCONNECT_T,),
           "a client that left while its body was read is never seen gone: its request"
           " runs to the end"),
    # ---- request schemas (control/api/schemas.py) ---------------------------------------
    Mutant("sc-n-zero", SC, "if not 1 <= n <= MAX_CHOICES:", "if not 0 <= n <= MAX_CHOICES:",
           (BOUNDS_T,), "n=0 is accepted and answers no choice at all"),
    Mutant("sc-n-unbounded", SC, "if not 1 <= n <= MAX_CHOICES:", "if n < 1:", (BOUNDS_T,),
           "one request with n=10000 queues ten thousand engine requests"),
    Mutant("sc-max-tokens-zero", SC, "max_tokens: int | None = Field(None, ge=1)",
           "max_tokens: int | None = Field(None, ge=0)", (BOUNDS_T,),
           "max_tokens=0 is accepted, where OpenAI refuses it"),
    Mutant("sc-temperature-negative", SC,
           "temperature: float | None = Field(None, ge=0.0, le=2.0)",
           "temperature: float | None = Field(None, le=2.0)", (BOUNDS_T,),
           "a negative temperature reaches the sampler and inverts the distribution"),
    Mutant("sc-top-p-zero", SC, "top_p: float | None = Field(None, gt=0.0, le=1.0)",
           "top_p: float | None = Field(None, ge=0.0, le=1.0)", (BOUNDS_T,),
           "top_p=0 reaches the sampler, which keeps no token"),
    Mutant("sc-logit-bias-negative-unbounded", SC,
           "if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:", "if value > MAX_LOGIT_BIAS:",
           (BOUNDS_T,), "a logit_bias of -1e308 is accepted and turns logits into -inf"),
    Mutant("sc-completion-logprobs-unbounded", SC,
           "logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # N alternatives",
           "logprobs: int | None = Field(None, ge=0)  # N alternatives", (LOGPROBS_T,),
           "completions' logprobs=100000 asks the engine for a vocabulary's alternatives"
           " per token"),
    Mutant("sc-top-without-logprobs", SC, 'if top and not info.data.get("logprobs"):',
           'if top and info.data.get("logprobs") is None:', (LOGPROBS_T,),
           "top_logprobs without logprobs=true is accepted and silently answers none"),
    # ---- the answer format (control/api/openai_format.py) -------------------------------
    Mutant("of-total-without-prompt", OF,
           "total_tokens=self.prompt_tokens + completion_tokens)",
           "total_tokens=completion_tokens)", (USAGE_T,),
           "usage.total_tokens leaves out the prompt: clients bill and budget too little"),
    Mutant("of-continuous-without-asking", OF,
           "if self.continuous_usage and tokens is not None else None)",
           "if tokens is not None else None)", (CONTINUOUS_T,),
           "every chunk carries usage when only include_usage was asked (OpenAI sends null)"),
    Mutant("of-done-after-each-choice", OF, "        if not last:\n            return chunks\n",
           "", (NOT_LAST_T,), "with n > 1 the first choice's finish sends [DONE]: the client"
           " stops reading and loses the other choices"),
    Mutant("of-held-back-logprobs-lost", OF,
           "logprobs = self.logprobs(entries, index=index) if entries else None",
           "logprobs = None", (HELD_BACK_T,),
           "logprobs of tokens held back (a partial character, a possible stop) never arrive"),
    Mutant("of-tenant-header-raw", OF,
           '"X-Batchpilot-Tenant": header_text(self.meta.tenant)',
           '"X-Batchpilot-Tenant": self.meta.tenant', (HEADERS_T,),
           "a tenant named in any script cannot be sent in a header: the answer fails"),
    Mutant("of-final-lane-admissions", OF,
           "        headers[\"X-Batchpilot-Lane\"] = header_text(info.lane)\n", "",
           (HEADERS_T,), "the final X-Batchpilot-Lane names admission's guess, not the lane"
           " the engine ran the request in"),
    Mutant("of-default-slo-for-every-lane", OF,
           "slo = live.lane_slo(live.lane(fmt.lane))", "slo = live.default_slo", (SLO_T,),
           "an answer reports the default SLO, not its lane's: clients count goodput wrong"),
    # ---- a live config patch (engine/config/patch.py) -----------------------------------
    Mutant("pt-null-removes-a-setting", PT,
           "if patch[key] is None and key not in MAPPINGS + NULLABLE:",
           "if False and patch[key] is None:", (INVALID_T,),
           '{"max_num_seqs": null} silently resets the setting to its default'),
    Mutant("pt-applied-unvalidated", PT, "    new.validate(static)\n    return new",
           "    return new", (INVALID_T,),
           "a patch past the KV pool or naming a missing lane is installed in the engine"),
    Mutant("pt-tenant-lanes-dropped", PT, 'data["tenant_lanes"] = dict(live.tenant_lanes)',
           'data["tenant_lanes"] = {}', (KEEPS_T,),
           "any patch moves every tenant back to the default lane"),
    Mutant("pt-version-reset", PT, "new = live_from_dict(merged).replace(version=live.version)",
           "new = live_from_dict(merged)", (KEEPS_T,),
           "a checked patch loses the version in force: the history shows version 0"),
    Mutant("pt-nullable-lost", PT,
           "    merged.update({key: None for key in NULLABLE if key in patch and patch[key]"
           " is None})\n", "", (ROUND_TRIP_T,),
           '{"long_context_lane": null} leaves long-context routing on'),
    Mutant("pt-removal-replayed-as-null", PT,
           "            node.pop(last, None)  # a lane or a tenant's lane removed",
           "            node[last] = new", (REPLAY_T,),
           "a what-if replaying a removed tenant's lane move fails to rebuild the config"),
    Mutant("pt-static-told-unknown", PT,
           "static = sorted(k for k in data if KEY_ALIASES.get(k, k) in STATIC_KEYS)",
           "static = []", (STATIC_T,),
           "an operator changing num_kv_blocks live is told the key is unknown, not that it"
           " needs a restart"),
    # ---- the read deadlines (control/serve/read_deadlines.py) ---------------------------
    Mutant("rd-body-deadline-unarmed", RD,
           "        self._in_head = False\n        self._arm(self.body_s, self._body_late)",
           "        self._in_head = False\n        self._disarm()", (CLOSES_T, NEVER_T),
           "a client that declares a body and never sends it holds its connection forever"),
    Mutant("rd-next-head-untimed", RD,
           "        self._in_head, self._head_bytes = True, 0\n"
           "        self._arm(self.headers_s, self._headers_late)",
           "        self._in_head, self._head_bytes = True, 0", (NEXT_HEAD_T,),
           "slowloris on a kept-alive connection: the second request's headers may trickle"
           " forever"),
    Mutant("rd-head-bytes-not-reset", RD, "self._in_head, self._head_bytes = True, 0",
           "self._in_head = True", (OWN_LIMIT_T,),
           "a long-lived keep-alive client (an SDK's pool) gets a 431 after enough requests"),
    Mutant("rd-body-counted-as-head", RD,
           "if self._in_head and not self.transport.is_closing():",
           "if not self.transport.is_closing():", (BIG_BODY_T,),
           "a 1 MiB body sent with its headers gets a 431"),
    Mutant("rd-answer-timed", RD,
           "    def on_message_complete(self) -> None:\n        self._disarm()\n",
           "    def on_message_complete(self) -> None:\n", (ON_TIME_T,),
           "a request whose answer takes longer than BODY_S gets a 408 and is cut off"),
    Mutant("rd-late-body-kept-open", RD,
           '"closed a connection whose request body took over %g s", self.body_s)\n'
           "        self.transport.close()",
           '"closed a connection whose request body took over %g s", self.body_s)',
           (CLOSES_T,), "after its 408 a slow client keeps its connection and file descriptor"),
    Mutant("rd-late-head-kept-open", RD,
           '"closed a connection whose request headers took over %g s", self.headers_s)\n'
           "            self.transport.close()",
           '"closed a connection whose request headers took over %g s", self.headers_s)',
           (NEXT_HEAD_T, NOTHING_T), "a connection that sends nothing is held forever"),
    # ---- the tenants' book (engine/lanes/tenants.py) ------------------------------------
    Mutant("tn-zero-counts-kept", TN, "    if num:\n        counts[key] = num",
           "    if num >= 0:\n        counts[key] = num", (LEAVES_T,),
           "a departed tenant stays active forever: state grows with every user ever seen"),
    Mutant("tn-own-lead-forgotten", TN,
           "vtime = max(own, self.vtime_high if floor is None else floor)",
           "vtime = self.vtime_high if floor is None else floor", (LEAD_T,),
           "a running tenant far ahead queues again level with the others and takes their"
           " share"),
    Mutant("tn-newcomer-at-zero", TN,
           "vtime = max(own, self.vtime_high if floor is None else floor)",
           "vtime = max(own, 0.0 if floor is None else floor)", (NEWCOMER_T,),
           "a newcomer joining an empty queue runs alone until it catches up with tenants"
           " that ran long before"),
    Mutant("tn-floor-kept-low", TN,
           "            self._floor_stale = True  # a tenant left the queue: the floor may rise\n",
           "", (FLOOR_T,), "newcomers join at a departed tenant's low virtual time and are"
           " served ahead of tenants that waited"),
    Mutant("tn-cancelled-remembered", TN,
           "            if finished:\n                self.forget_if_idle(tenant)\n", "",
           (LEAVES_T,), "every tenant whose request was cancelled while queued is kept forever"),
    Mutant("tn-preempted-forgotten", TN,
           "        if not requeued:\n            self.forget_if_idle(tenant)",
           "        self.forget_if_idle(tenant)", (LEAD_T,),
           "a preempted tenant forgets its lead and rejoins level with tenants it was ahead of"),
    Mutant("tn-high-not-raised", TN, "        self.vtime_high = high\n", "", (NEWCOMER_T,),
           "a newcomer to an empty queue joins at a stale high and runs ahead of the others"),
    Mutant("tn-fair-rebuild-forgets", TN, "        if not fair:\n            self.vtimes.clear()",
           "        if fair:\n            self.vtimes.clear()", (REBUILT_T,),
           "a config change that rebuilds a fair lane's queue resets every tenant's share"),
]
