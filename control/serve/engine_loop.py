"""The engine loop: one thread owns the Engine and its OutputProcessor; every other thread
and coroutine talks to it through a command queue.

    route coroutine (event loop)              engine thread ("engine-loop")
    ----------------------------              -----------------------------
    await async_engine.add(sub)    --cmd-->   engine.add_request, processor.add
        <-- AdmissionDecision (loop.call_soon_threadsafe)
    await stream.queue.get()       <--event-- step(), processor.process(), one
                                              call_soon_threadsafe per step and loop
    async_engine.abort(id, why)    --cmd-->   engine.abort: blocks freed before the next
                                              step; a queued request never runs

The thread drains all commands before each step, steps while there is work, and blocks on
the command queue when idle (waking every HEARTBEAT_S to show it is alive). A step that
fails ends only the requests of the failing part of its batch (the engine contains it:
engine/fault_isolation.py); the loop logs it, counts it and goes on, and `step_health.py`
turns /readyz 503 only when steps keep failing.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from control.metrics.observer import Observer
from control.serve.bootstrap import EngineParts
from control.serve.loop_records import ABORT_REASONS, LoopStats
from control.serve.step_health import StepHealth
from control.serve.streams import Delivery, RequestStream, StreamEvent, Submission, deliver, resolve
from engine.config import LiveConfig
from engine.engine import Engine
from engine.records import AdmissionDecision
from engine.request import RequestStatus

log = logging.getLogger("batchpilot.engine_loop")

HEARTBEAT_S = 1.0  # an idle loop wakes this often, so /readyz can tell it is alive
DRAINING_RETRY_AFTER_S = 1.0  # another replica can take the request at once

class AsyncEngine:
    """Thread-safe front of an Engine. Build it with a factory (which loads the model in the
    engine thread), `start()` it, then `await add(...)` from coroutines."""

    def __init__(self, build: Callable[[], EngineParts], *, stall_after_s: float = 60.0,
                 observer: Observer | None = None):
        self._build = build
        self.observer = observer  # metrics and trace, fed by the engine thread
        self.stall_after_s = stall_after_s
        self._commands: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._streams: dict[str, Delivery] = {}  # engine thread only
        self._engine: Engine | None = None  # engine thread only
        self.parts: EngineParts | None = None  # set once loaded; its tokenizer is read-only
        self.loaded = threading.Event()  # set when loaded, or when loading failed
        self.load_error: BaseException | None = None
        self.live_config: LiveConfig | None = None  # the installed snapshot (immutable)
        self.stats = LoopStats()
        self.abort_counts: Counter[str] = Counter()  # by reason; engine thread writes
        self.reject_counts: Counter[str] = Counter()  # admission rejections by reason
        self.step_health = StepHealth()  # failed steps -> readiness; engine thread writes
        self.draining = False  # shutting down (SIGTERM): for good
        self.admission_paused = False  # an operator's drain (control API): until resumed
        self._beat = time.monotonic()  # last sign of life of the engine thread
        self._stopped = False

    # ---- life ------------------------------------------------------------------------
    def start(self) -> AsyncEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._commands.put(("stop",))
            self._thread.join(timeout_s)

    async def wait_loaded(self, poll_s: float = 0.05) -> EngineParts:
        while not self.loaded.is_set():
            await asyncio.sleep(poll_s)
        if self.parts is None:
            raise RuntimeError(f"the model failed to load: {self.load_error}")
        return self.parts

    def serving_problem(self) -> str | None:
        """None while the process can serve at all (the model loaded, the engine loop alive
        and not stalled: vLLM's /health); else why not."""
        if not self.loaded.is_set():
            return "the model is loading"
        if self.parts is None:
            return f"the model failed to load: {self.load_error}"
        if self._thread is None or not self._thread.is_alive():
            return "the engine loop is not running"
        busy_s = time.monotonic() - self._beat
        if busy_s > self.stall_after_s:
            return f"the engine loop has made no progress for {busy_s:.1f}s"
        return None

    def health(self) -> str | None:
        """None when ready to serve; else why not (for /readyz)."""
        problem = self.serving_problem()
        if problem is not None:
            return problem
        if self.draining:
            return "the server is draining (shutting down)"
        if self.admission_paused:
            return "admission is paused by an operator (`batchpilot ctl resume` reopens it)"
        return self.step_health.reason()

    # ---- commands (any thread) -------------------------------------------------------
    async def add(self, sub: Submission) -> tuple[AdmissionDecision, RequestStream | None]:
        """Admit or reject at once; an admitted request's events arrive on the stream."""
        loop = asyncio.get_running_loop()
        decided: asyncio.Future[AdmissionDecision] = loop.create_future()
        stream = RequestStream(sub.request_id)
        self._commands.put(("add", sub, Delivery(loop, stream.queue), decided))
        try:
            decision = await decided
        except asyncio.CancelledError:  # the caller left: the request must never run
            self.abort(sub.request_id, "client_disconnect")
            raise
        return decision, (stream if decision.accepted else None)

    def abort(self, request_id: str, reason: str) -> None:
        """End the request with ABORT_REASONS[reason]; a no-op once it has finished."""
        if reason not in ABORT_REASONS:
            raise ValueError(f"abort reason {reason!r} must be one of {sorted(ABORT_REASONS)}")
        self._commands.put(("abort", request_id, reason))

    def abort_all(self, reason: str) -> None:
        self._commands.put(("abort_all", reason))

    def start_draining(self) -> None:
        """From now on every new request is refused (503); the running ones go on."""
        self.draining = True

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Run fn(engine) on the engine thread, between steps; returns its result."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._commands.put(("call", fn, loop, done))
        return await done

    # ---- the engine thread -----------------------------------------------------------
    def _run(self) -> None:
        try:
            self.parts = self._build()
        except BaseException as exc:  # reported by /readyz and the server, not raised here
            log.exception("loading the model failed")
            self.load_error = exc
            self.loaded.set()
            return
        self._engine = self.parts.engine
        self.live_config = self._engine.live_config
        if self.observer is not None:
            self.observer.on_change(self._engine)
        self.loaded.set()
        log.info("engine loop running")
        try:
            while not self._stopped:
                self._beat = time.monotonic()
                self._drain_commands(block=not self._engine.has_unfinished_requests())
                if self._engine.has_unfinished_requests() and not self._stopped:
                    self._step()
            if not self._engine.requests and self._engine.has_unfinished_requests():
                self._step()  # stopping: report the requests just ended (runs no model)
        except BaseException:  # a bug: /readyz reports the dead loop; no client hangs
            log.exception("the engine loop died")
            self._fail_streams()
            raise

    def _fail_streams(self) -> None:
        for request_id, delivery in list(self._streams.items()):
            event = StreamEvent(request_id, "", (), 0, finished=True, finish_reason="error")
            _call_soon(delivery.loop, deliver, [(delivery.queue, event)])
        self._streams.clear()

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=HEARTBEAT_S) if block \
                else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
        if self.observer is not None:
            self.observer.on_change(self._engine)

    def _handle(self, command: tuple[Any, ...]) -> None:
        kind = command[0]
        if kind == "add":
            self._add(*command[1:])
        elif kind == "abort":
            self._abort(*command[1:])
        elif kind == "abort_all":
            for request_id in list(self._engine.requests):
                self._abort(request_id, command[1])
        elif kind == "call":
            fn, loop, done = command[1:]
            try:
                result, error = fn(self._engine), None
            except Exception as exc:
                result, error = None, exc
            self.live_config = self._engine.live_config
            _call_soon(loop, resolve, done, result, error)
        elif kind == "stop":
            self._stopped = True

    def _add(self, sub: Submission, delivery: Delivery, decided: asyncio.Future) -> None:
        engine = self._engine
        if self.draining or self.admission_paused:  # refused, recorded like any rejection
            reason, why = ("draining", "the server is shutting down") if self.draining else (
                "admission_paused", "an operator paused admission on this server")
            decision = engine.refuse(
                sub.request_id, sub.prompt_token_ids, reason, f"{why} and admits no new"
                " requests; retry on another replica", DRAINING_RETRY_AFTER_S,
                tenant=sub.tenant, lane=sub.lane, priority=sub.priority,
                arrival_time=sub.arrival_time, trace=sub.trace)
        else:
            try:
                decision = engine.add_request(
                    sub.request_id, sub.prompt_token_ids, sub.params, tenant=sub.tenant,
                    lane=sub.lane, priority=sub.priority, deadline=sub.deadline,
                    cache_salt=sub.cache_salt, arrival_time=sub.arrival_time,
                    tokenize_s=sub.tokenize_s, wait_for=sub.wait_for, trace=sub.trace,
                    resent=sub.resent)
            except Exception as exc:  # e.g. a duplicate request id
                _call_soon(delivery.loop, resolve, decided, None, exc)
                return
            if decision.accepted:
                self.parts.processor.add(sub.request_id, sub.prompt, sub.prompt_token_ids,
                                         sub.params)
                self._streams[sub.request_id] = delivery
                if sub.timeout_at is not None and engine.clock() >= sub.timeout_at:
                    # NOTE: ended here, not by the route's timer: that abort reaches this
                    # thread only after the event loop runs it, and a fast engine can finish
                    # a short request in the steps between
                    self._abort(sub.request_id, "request_timeout")
        if not decision.accepted:
            self.reject_counts[decision.reason or "rejected"] += 1
        if not _call_soon(delivery.loop, resolve, decided, decision, None) and \
                decision.accepted:
            self._abort(sub.request_id, "client_disconnect")  # its event loop is gone

    def _abort(self, request_id: str, reason: str) -> None:
        status, detail = ABORT_REASONS[reason]
        if self._engine.abort(request_id, status, detail):
            self.abort_counts[reason] += 1

    def _step(self) -> None:
        engine, processor = self._engine, self.parts.processor
        started = time.perf_counter()
        try:
            step = engine.step()
            step_done = time.perf_counter()
        except Exception as exc:  # outside execute and update: which requests it touched
            step = self.step_health.step_raised(engine, exc, log)  # is unknown: all end
            step_done = time.perf_counter()
        else:
            if step.failure is not None:
                self.step_health.step_failed(step.failure, log)
            elif step.record is not None:
                self.step_health.on_success()
        if self.observer is not None:
            self.observer.on_step(engine, step)
        outputs, stopped = processor.process(step)
        for request_id in stopped:  # a stop string ended the text: free the blocks now
            engine.abort(request_id, RequestStatus.STOPPED, "stop string")
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            delivery = self._streams.get(out.request_id)
            if delivery is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            batches.setdefault(delivery.loop, []).append(
                (delivery.queue, StreamEvent.from_output(out, step_done)))
        for loop, items in batches.items():
            if not _call_soon(loop, deliver, items):  # that event loop is closed
                for _queue, event in items:
                    self._streams.pop(event.request_id, None)
                    self._abort(event.request_id, "client_disconnect")
        self._publish(time.perf_counter() - started)

    def _publish(self, step_s: float) -> None:
        engine = self._engine
        stats = engine.stats()
        self.stats = LoopStats(
            steps=self.stats.steps + 1, last_step_at=time.time(), last_step_s=step_s,
            running=stats["running"], waiting=stats["waiting"], streams=len(self._streams),
            kv_blocks_used=engine.block_manager.num_used, kv_usage=stats["kv_usage"],
            queue_slo_share=stats["queue_slo_share"])


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> bool:
    """Schedule fn on `loop` from the engine thread; False when that loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        return False
    return True
