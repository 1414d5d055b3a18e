"""`make mutants` bugs at the server's edge (size limits at their value, logprobs, message
parts, arrival, refusals and their Retry-After) and in its engine loop, step health and
settings (hand-planted 2026-12-07, third pass): each one passed every test then, and the
test it names was written to catch it."""

from __future__ import annotations

from mutant_spec import CTL, SEC, Mutant

SERVING_MUTANTS: list[Mutant] = [
    Mutant("prompt-chars-at-limit", "control/api/request_limits.py",
           "    if chars > limit:", "    if chars >= limit:",
           (SEC + "test_hostile_fields.py::test_a_request_at_exactly_each_limit_is_served",),
           "a prompt of exactly max_prompt_chars characters is refused"),
    Mutant("single-choice-bounded", "control/api/request_limits.py",
           "if body.n > 1 and total > limits.max_generated_tokens:",
           "if total > limits.max_generated_tokens:",
           (SEC + "test_hostile_fields.py::test_a_request_at_exactly_each_limit_is_served",),
           "a one-choice request with max_tokens over max_generated_tokens is a 400"),
    Mutant("stop-chars-at-limit", "control/api/request_limits.py",
           "if len(stop) > limits.max_stop_chars:", "if len(stop) >= limits.max_stop_chars:",
           (SEC + "test_hostile_fields.py::test_a_request_at_exactly_each_limit_is_served",),
           "a stop string of exactly max_stop_chars characters is refused"),
    Mutant("messages-at-limit", "control/api/request_limits.py",
           "if count > limits.max_messages:", "if count >= limits.max_messages:",
           (SEC + "test_hostile_fields.py::test_a_request_at_exactly_each_limit_is_served",),
           "a chat of exactly max_messages messages is refused"),
    Mutant("sixteen-stops-refused", "control/api/list_shapes.py",
           "    if isinstance(value, list) and len(value) > limit:",
           "    if isinstance(value, list) and len(value) >= limit:",
           (SEC + "test_hostile_fields.py::test_a_request_at_exactly_each_limit_is_served",),
           "16 stop strings, the documented most, are refused (and every bounded list one short)"),
    Mutant("timeout-ignores-arrival", "control/api/choices.py",
           "streaming=streaming, waited_s=waited_s,", "streaming=streaming, waited_s=0.0,",
           (CTL + "api/test_arrival_limits.py::test_every_choices_timeout_counts_from_arrival",),
           "a choice's X-Request-Timeout-Ms restarts at admission: the wait before it is free"),
    Mutant("loop-lag-counts-the-period", "control/api/delivery.py",
           "due = time.perf_counter() + LAG_PROBE_S", "due = time.perf_counter()",
           (CTL + "api/test_delivery_metrics.py::test_a_timer_that_fires_on_time_has_no_lag",),
           "the event-loop lag histogram adds the 50 ms timer period to every observation"),
    Mutant("nine-ignored-named", "control/api/field_policy.py",
           "len(names) == MAX_NAMED)", "len(names) > MAX_NAMED)",
           (CTL + "api/test_ignored_fields.py::test_a_request_and_its_messages_share_the_cap_on"
                  "_names",),
           "a body's and its messages' unknown fields are named nine and more, past the cap"),
    Mutant("percent-not-encoded", "control/api/header_values.py",
           ' and "%" not in value:', ":",
           (CTL + "api/test_ignored_fields.py::test_a_name_with_a_percent_sign_comes_back_whole"
                  "_from_the_header",),
           "a header name with '%' is sent raw: unquoting it gives another name"),
    Mutant("fake-engine-prompt-logprobs", "control/api/logprobs_fields.py",
           '("logprobs", body.engine_logprobs),\n                                               '
           '("prompt_logprobs", body.prompt_logprobs))',
           '("logprobs", body.engine_logprobs),)',
           (CTL + "api/test_logprobs_api.py::test_an_engine_without_a_model_refuses_prompt"
                  "_logprobs",),
           "an engine without a model answers prompt_logprobs with none, no 400"),
    Mutant("prompt-rank-from-zero", "control/api/logprobs_format.py",
           "enumerate(e.top[:top_n], start=1)", "enumerate(e.top[:top_n])",
           (CTL + "api/test_logprobs_api.py::test_prompt_logprob_ranks_count_from_one",),
           "vLLM's prompt_logprobs rank the likeliest token 0, not 1"),
    Mutant("logprob-not-floored", "control/api/logprobs_format.py",
           "    return max(logprob, MIN_LOGPROB)", "    return logprob",
           (CTL + "api/test_logprobs_api.py::test_a_minus_infinity_logprob_is_floored_so_the"
                  "_answer_is_json",),
           "a -inf logprob reaches the JSON body: an invalid answer"),
    Mutant("text-parts-joined-with-space", "control/api/message_schemas.py",
           'text = "".join(part.text', 'text = " ".join(part.text',
           (CTL + "api/test_vllm_endpoints.py::test_text_parts_are_the_message_their_texts_make",),
           "text parts gain spaces between them: another prompt than the client sent"),
    Mutant("system-without-content", "control/api/message_schemas.py",
           'if self.content is None and self.role != "assistant":',
           'if self.content is None and self.role == "user":',
           (CTL + "api/test_errors.py::test_bad_parameters_are_400",),
           "a system message without content is taken as empty, not a 400"),
    Mutant("shutdown-without-retry-after", "control/api/responses.py",
           "        if status == 503:\n            headers.update(retry_after(SHUTDOWN_RETRY_AFTER"
           "_S))\n",
           "",
           (CTL + "api/test_errors.py::test_a_request_the_shutdown_cuts_is_503_with_retry_after",),
           "a whole-body request cut by shutdown is a 503 without Retry-After"),
    Mutant("edge-elapsed-negative", "control/api/arrival.py",
           "min(max(seconds, 0.0), MAX_EDGE_ELAPSED_S)", "min(seconds, MAX_EDGE_ELAPSED_S)",
           (CTL + "api/test_arrival_limits.py::test_the_edges_elapsed_header_moves_arrival_back"
                  "_within_bounds",),
           "a negative edge-elapsed header moves a request's arrival into the future"),
    Mutant("rejections-not-counted", "control/serve/engine_loop.py",
           '            self.reject_counts[decision.reason or "rejected"] += 1\n',
           "            pass\n",
           (CTL + "api/test_errors.py::test_readyz_counts_refusals_by_reason",),
           "/readyz's rejections stay empty whatever admission refuses"),
    Mutant("abort-counted-when-finished", "control/serve/engine_loop.py",
           "        if self._engine.abort(request_id, status, detail):\n            self.abort"
           "_counts[reason] += 1",
           "        self._engine.abort(request_id, status, detail)\n        self.abort"
           "_counts[reason] += 1",
           (CTL + "api/test_disconnects.py::test_an_abort_that_comes_after_the_request_finished_is"
                  "_not_counted",),
           "an abort arriving after its request finished is counted in /readyz's aborts"),
    Mutant("stall-in-ms", "control/serve/engine_loop.py",
           "if busy_s > self.stall_after_s:", "if busy_s > self.stall_after_s * 1000:",
           (CTL + "api/test_http_api.py::test_readyz_is_503_while_the_engine_thread_is_stuck_past"
                  "_stall_after_s",),
           "a stuck engine thread is reported only after 1000 x stall_after_s: /readyz stays 200"),
    Mutant("partial-failure-keeps-run", "control/serve/step_health.py",
           "            self.consecutive = 0  # part of the batch ran",
           "            pass  # part of the batch ran",
           (CTL + "serve/test_step_faults_live.py::test_a_step_in_which_some_requests_ran_ends_a"
                  "_run_of_whole_failures",),
           "a partly failed step does not reset the run: a working replica turns unready"),
    Mutant("new-failure-kind-no-traceback", "control/serve/step_health.py",
           "if self._logged[0] != kind or now - self._logged[1]", "if now - self._logged[1]",
           (CTL + "serve/test_step_faults_live.py::test_a_new_kind_of_failure_logs_its_traceback"
                  "_at_once",),
           "a different step failure within 10 s logs no traceback: the log hides why"),
    Mutant("failed-requests-per-step", "control/serve/step_health.py",
           "self.failed_requests += num_ended", "self.failed_requests += 1",
           (CTL + "serve/test_step_faults_live.py::test_readyz_counts_every_request_a_failed_step"
                  "_ended",),
           "/readyz's failed_requests counts failed steps, not the requests they ended"),
    Mutant("wait-ignores-alive", "control/serve/stop_signals.py",
           "while not stop.is_set() and alive():", "while not stop.is_set():",
           (CTL + "serve/test_stop_signals.py::test_the_wait_ends_when_what_it_watches_dies",),
           "`make run` keeps waiting after its server or dashboard exited"),
    Mutant("ipv6-url-unbracketed", "control/serve/settings.py",
           'host = f"[{self.host}]" if ":" in self.host else self.host', "host = self.host",
           (CTL + "serve/test_serve_settings.py::test_the_url_brackets_an_ipv6_host",),
           "the ready line gives http://::1:8000, a URL no client can open"),
    Mutant("model-name-trailing-slash", "control/serve/settings.py",
           'self.model.rstrip("/").rsplit("/", 1)', 'self.model.rsplit("/", 1)',
           (CTL + "api/test_http_api.py::test_a_model_started_by_its_path_is_served_by_its_name"
                  "_and_that_path",),
           "--model checkpoints/tiny/ serves a model named '' in /v1/models"),
    Mutant("zero-grace-refused", "control/serve/settings.py",
           "_require(self.shutdown_grace_s >= 0,", "_require(self.shutdown_grace_s > 0,",
           (CTL + "serve/test_serve_settings.py::test_a_shutdown_grace_of_zero_is_taken_and_a"
                  "_negative_one_refused",),
           "--shutdown-grace-s 0 (end at once) refuses to start"),
    Mutant("full-path-model-404", "control/serve/state.py",
           "return {self.settings.model_name, self.settings.model}",
           "return {self.settings.model_name}",
           (CTL + "api/test_http_api.py::test_a_model_started_by_its_path_is_served_by_its_name"
                  "_and_that_path",),
           "a client naming the model by the path it was started with gets a 404"),
    Mutant("chat-prompt-logprobs-dropped", "control/api/response_schemas.py",
           "    choices: list[ChatChoice]\n    prompt_logprobs: list[dict[str, dict[str, Any]] | "
           "None] | None = None  # vLLM's\n",
           "    choices: list[ChatChoice]\n",
           (CTL + "api/test_logprobs_api.py::test_every_field_of_an_answer_is_in_its_documented"
                  "_shape",),
           "/openapi.json's chat answer loses vLLM's prompt_logprobs field"),
]
