"""The goodput step sizing and SLO admission model, and the fleet's router (pass of
2026-12-07, late); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, ENG, Mutant

GP = "engine/scheduling/goodput.py"
RT = "control/fleet/router.py"
MODEL = ENG + "test_goodput_model.py::"
POLICY = ENG + "test_goodput_policy.py::"
ROUTER = CTL + "fleet/test_fleet_router.py::"
EDGES = CTL + "fleet/test_fleet_router_edges.py::"

SCHEDULING_ROUTING_MUTANTS: list[Mutant] = [
    # ---- goodput step sizing and admission's TTFT model --------------------------------
    Mutant("goodput-deferred-running-prompt-ahead", GP,
           "if req.num_computed_tokens < req.num_prompt_tokens and not req.slo_deferred:",
           "if req.num_computed_tokens < req.num_prompt_tokens:",
           (MODEL + "test_a_running_prompts_rest_is_ahead_of_the_queue_and_a_deferred_ones"
            "_is_not",),
           "a deferred prompt under way counts ahead of the queue it runs after: steps grow"
           " and requests that could meet their TTFT are shed or deferred"),
    Mutant("goodput-loosest-tpot-bounds-step", GP,
           "tpot_cap = min(tpot_cap, tpot)", "tpot_cap = max(tpot_cap, tpot)",
           (POLICY + "test_the_tightest_running_tpot_target_bounds_the_step",),
           "a grown step ignores the running streams' TPOT target: every stream's next token"
           " comes late"),
    Mutant("goodput-step-cap-below-base-target", GP,
           "cap = min(MAX_GROWTH * base_s, max(base_s, tpot_cap))",
           "cap = min(MAX_GROWTH * base_s, tpot_cap)",
           (MODEL + "test_a_stream_whose_tpot_is_under_the_base_target_never_shrinks_a_step",),
           "a stream with a TPOT under target_step_ms shrinks the steps of a queue past"
           " saving: the fixed cost is paid more often and the queue clears slower"),
    Mutant("goodput-slowdown-speeds-the-law", GP,
           "return max(0.0, run_s / self.slowdown - self.overhead_s) / run_s",
           "return max(0.0, run_s * self.slowdown - self.overhead_s) / run_s",
           (MODEL + "test_a_device_slower_than_its_law_clears_the_queue_slower_and_grows"
            "_for_it",),
           "a device running slower than its law is modelled as faster: steps grow too"
           " little and admission lets in requests that then miss their TTFT"),
    Mutant("goodput-past-deadline-needs-nothing", GP,
           "rate = work / slack if slack > 0 else math.inf",
           "rate = work / slack if slack > 0 else 0.0",
           (MODEL + "test_a_queued_request_already_past_its_deadline_grows_the_step_to_the"
            "_largest",),
           "a queue whose head is past its deadline keeps small steps, paying the fixed"
           " cost many times while it is past saving"),
    Mutant("goodput-running-prompts-not-ahead-of-queue", GP,
           "work, needed, missed = self.ahead_s, 0.0, False",
           "work, needed, missed = 0.0, 0.0, False",
           (MODEL + "test_the_running_prompts_ahead_of_the_queue_can_grow_the_step",),
           "queued requests are sized for as if the running prompts were done: steps stay"
           " small and they miss their TTFT behind them"),
    Mutant("goodput-queue-work-not-cumulative", GP,
           "            work += cost\n", "            work = self.ahead_s + cost\n",
           (POLICY + "test_a_burst_meets_more_slos_with_grown_steps_than_held_to_the_target",),
           "each queued request is judged as if first in line: a burst keeps small steps"
           " and its tail misses its TTFT"),
    Mutant("goodput-grown-step-without-margin", GP,
           "self.step_for_rate(min(GROWTH_MARGIN * needed, best_rate))",
           "self.step_for_rate(min(needed, best_rate))",
           (MODEL + "test_a_grown_step_asks_growth_margin_times_the_rate_the_queue_needs",),
           "a grown step gives exactly the rate the queue needs: a step that runs a little"
           " slow makes the requests it grew for miss their TTFT"),
    Mutant("goodput-other-lanes-share-unbounded", GP,
           "others = sum(min(work, own * weights[name] / weight)", "others = sum(work",
           (MODEL + "test_a_predicted_ttft_is_the_wait_then_the_work_ahead_at_the_largest"
            "_step",),
           "a chat request counts the bulk lane's whole backlog ahead of it, though fair"
           " share serves it first: chat is shed whenever bulk work is queued"),
    Mutant("goodput-wait-before-admission-ignored", GP,
           "waited = max(0.0, now - req.arrival_time)", "waited = 0.0",
           (MODEL + "test_a_predicted_ttft_is_the_wait_then_the_work_ahead_at_the_largest"
            "_step",),
           "a request that waited in a proxy before the engine saw it is predicted to meet"
           " its TTFT: admitted, then it misses"),
    Mutant("goodput-ttft-predicted-at-base-step", GP,
           "rate = self.rate(self.cap_s)\n        work = self.ahead_s + own + others",
           "rate = self.rate(self.base_s)\n        work = self.ahead_s + own + others",
           (MODEL + "test_a_predicted_ttft_is_the_wait_then_the_work_ahead_at_the_largest"
            "_step",),
           "admission prices the queue at the small step, not the grown step the scheduler"
           " will run: it sheds requests that would have met their TTFT"),
    Mutant("goodput-alone-ttft-at-base-step", GP,
           "idle = QueueModel(law, slowdown, base_s, MAX_GROWTH * base_s, law.fixed_s, 0.0)",
           "idle = QueueModel(law, slowdown, base_s, base_s, law.fixed_s, 0.0)",
           (MODEL + "test_a_prompt_that_meets_the_default_lanes_ttft_alone_at_the_largest"
            "_step_stays",),
           "a mid-sized prompt that chat serves in time is sent to the long-context lane,"
           " behind its long prompts"),
    # ---- the fleet's router ------------------------------------------------------------
    Mutant("router-inflight-not-load", RT,
           "return max(self.inflight, self.waiting + self.running)",
           "return self.waiting + self.running",
           (ROUTER + "test_affinity_holds_within_the_imbalance_and_yields_past_it",),
           "a burst between two load polls piles onto one replica: the ingress's own"
           " in-flight requests do not count"),
    Mutant("router-whole-prompt-hashed", RT,
           "return prompt[: policy.prefix_chars]", "return prompt",
           (EDGES + "test_completions_that_share_their_first_prefix_chars_share_a_key",),
           "completions behind one system prompt scatter over the replicas: each computes"
           " the shared prefix again"),
    Mutant("router-one-prompt-list-unkeyed", RT,
           "if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):",
           "if False:",
           (EDGES + "test_a_prompt_sent_as_a_list_of_one_string_is_keyed_as_that_string",),
           "a prompt sent as [\"...\"] (as OpenAI clients may) has no key and goes by load,"
           " away from its cached prefix"),
    Mutant("router-token-ids-cut-at-chars", RT,
           "prompt[: policy.prefix_tokens]", "prompt[: policy.prefix_chars]",
           (ROUTER + "test_shared_system_prompt_shares_a_replica_and_tenants_may_split",),
           "prompts sent as token ids hash 256 ids instead of 64: those sharing a prefix"
           " scatter"),
    Mutant("router-hash-ignores-replica", RT,
           'hashlib.blake2b(key + b"\\x00" + str(replica_id).encode(), digest_size=8)',
           "hashlib.blake2b(key, digest_size=8)",
           (ROUTER + "test_a_key_always_goes_to_its_replica_and_keys_spread_evenly",),
           "every prefix prefers the same replica: one replica takes the whole fleet's"
           " traffic up to the imbalance"),
    Mutant("router-precise-on-no-match", RT,
           'if policy.mode == "precise" and matched and max(matched.values()) > 0:',
           'if policy.mode == "precise" and matched:',
           (EDGES + "test_precise_places_a_prompt_nobody_holds_on_its_hashed_replica_despite"
            "_some_load",),
           "precise mode sends a new prefix's requests to the idlest replica each time:"
           " they scatter and each replica computes the prefix"),
    Mutant("router-precise-never-falls-back-to-affinity", RT,
           'if policy.mode in ("affinity", "precise") and key is not None:',
           'if policy.mode == "affinity" and key is not None:',
           (ROUTER + "test_precise_places_prompts_nobody_holds_by_affinity",),
           "precise mode places prompts nobody holds at random: a new prefix never gathers"),
    Mutant("router-precise-holder-unbounded", RT,
           "        if _within(best, live, policy):\n            held",
           "        if True:\n            held",
           (ROUTER + "test_a_too_loaded_holder_spills_to_the_hashed_replica_then_balances",),
           "a hot prefix's holder takes every request however loaded or full it is"),
    Mutant("router-precise-spill-least-hashed", RT,
           "rank = -rendezvous_score(key, r.replica_id)",
           "rank = rendezvous_score(key, r.replica_id)",
           (ROUTER + "test_a_too_loaded_holder_spills_to_the_hashed_replica_then_balances",),
           "a busy holder's spill-over goes to the replica the prefix's hash likes least:"
           " spills and a restarted replica's refill scatter"),
    Mutant("router-precise-tie-ignores-load", RT,
           "return (cost, r.load, r.kv_usage, rank)", "return (cost, rank, r.load, r.kv_usage)",
           (EDGES + "test_precise_breaks_a_tie_in_cost_by_load_before_the_hash",),
           "between replicas that cost the same the hashed one takes every request until it"
           " is max_imbalance ahead of an idle one"),
    Mutant("router-kv-lead-counts-below-busy", RT,
           "kv_ok = (best.kv_usage < policy.kv_busy\n             or",
           "kv_ok = (best.kv_usage < policy.kv_busy\n             and",
           (ROUTER + "test_affinity_holds_within_the_imbalance_and_yields_past_it",),
           "a replica with KV room to spare turns its own prefix's requests away for a KV"
           " lead, scattering the requests whose blocks it holds"),
    Mutant("router-zero-imbalance-refused", RT,
           "if self.max_imbalance < 0:", "if self.max_imbalance <= 0:",
           (EDGES + "test_a_policy_allowing_no_imbalance_is_valid_and_takes_the_least_loaded",),
           "a fleet configured with max_imbalance 0 refuses to start"),
]
