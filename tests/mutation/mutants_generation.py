"""One admitted request's life at the HTTP layer: its deadlines, aborts and a client that
leaves, alone and as n choices (pass of 2026-12-07, late: control/api/generation.py had one
planted bug); each has a test that fails on it."""

from __future__ import annotations

from mutant_spec import CTL, Mutant

GEN = "control/api/generation.py"
DEADLINES_T = CTL + "api/test_generation_deadlines.py"
TIMEOUTS_T = CTL + "api/test_timeouts.py"
DISCONNECTS_T = CTL + "api/test_disconnects.py"
CHOICES_UNIT_T = CTL + "api/test_generation_choices.py::"

GENERATION_MUTANTS: list[Mutant] = [
    Mutant("gen-idle-timeout-on-whole-bodies", GEN,
           "if not self.streaming or live is None:", "if live is None:",
           (DEADLINES_T, TIMEOUTS_T),
           "a non-streamed request whose tokens come slowly is aborted as an idle stream"),
    Mutant("gen-timeout-from-admission", GEN, "self.started = clock() - waited_s",
           "self.started = clock()", (DEADLINES_T, TIMEOUTS_T),
           "X-Request-Timeout-Ms counts from admission: the body read and tokenization are"
           " not in the client's budget"),
    Mutant("gen-timeout-reasons-swapped", GEN,
           '            self.abort("request_timeout")\n        else:\n'
           '            self.abort("stream_idle_timeout")',
           '            self.abort("stream_idle_timeout")\n        else:\n'
           '            self.abort("request_timeout")',
           (DEADLINES_T, TIMEOUTS_T),
           "a request past its X-Request-Timeout-Ms is reported as an idle stream, and the"
           " reverse: the operator tunes the wrong setting"),
    Mutant("gen-abort-counted-twice", GEN,
           "if self.abort_reason is None and not self.finished:", "if not self.finished:",
           (DEADLINES_T + "::test_a_request_is_aborted_once_with_its_first_reason",),
           "a timed-out request whose client then leaves is aborted twice: counted twice,"
           " its reason overwritten"),
    Mutant("gen-close-leaves-request-running", GEN,
           '        if not self.finished:\n            self.abort("client_disconnect")\n',
           "", (DISCONNECTS_T,),
           "a response closed early leaves its request decoding for nobody, KV held"),
    Mutant("gen-grace-ignores-stall-limit", GEN,
           "grace_s = max(ABORT_GRACE_S, self.engine.stall_after_s)",
           "grace_s = ABORT_GRACE_S",
           (DEADLINES_T + "::test_an_aborted_request_gets_the_engines_stall_limit_when_longer"
            "_than_the_grace",),
           "an aborted request inside one long step is reported as an unresponsive engine"),
    Mutant("gen-early-timer-aborts", GEN,
           "                if self._wait_s() <= 0.0:  # else a token moved the idle deadline on",
           "                if True:",
           (DEADLINES_T + "::test_a_timer_that_fires_after_a_new_token_re_arms_instead_of"
            "_aborting",),
           "a stream whose tokens keep coming is aborted as idle when the timer armed"
           " before its last token fires"),
    Mutant("gen-choices-out-of-order", GEN,
           "for task in sorted(done, key=waiting.__getitem__):", "for task in done:",
           (CHOICES_UNIT_T + "test_choices_ready_together_come_out_in_index_order",),
           "n choices' events that arrive together go out in set order"),
    Mutant("gen-disconnect-not-shielded", GEN, "return await asyncio.shield(self._task)",
           "return await self._task",
           (CHOICES_UNIT_T + "test_a_choice_that_stops_watching_leaves_the_disconnect_to_the"
            "_others",),
           "with n > 1, the first choice to finish cancels the others' disconnect watch: a"
           " client that leaves then keeps the rest decoding"),
]
