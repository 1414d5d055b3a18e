"""Ctrl+C and SIGTERM as a request to stop, for a main thread that only waits (`batchpilot
fleet` on Ray, `make run`'s server and dashboard).

Two ways such a wait can miss the signal, both met on this machine:
- A process a shell without job control starts in the background (`make run &`, a CI
  step) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: the
  handlers here are installed for SIGINT too, explicitly.
- The kernel may deliver a process's signal to any thread that does not block it (Ray's
  gRPC threads, a C extension's). Python runs its handler only when the main thread next
  returns to the interpreter, which a wait without a timeout never does: `batchpilot fleet`
  once ignored Ctrl+C and SIGTERM for minutes. So the wait polls, every POLL_S.

The handler itself only puts the signal on a SimpleQueue (whose put is documented as safe
in a signal handler) and a relay thread sets the event. Setting it in the handler takes the
event's lock, which the main thread holds for a moment on each poll: a signal handled in
that moment waited on its own thread's lock for good (CI saw the stop hang once).
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Iterable

POLL_S = 0.1  # the longest a stop request waits for the main thread to see it: a fleet
# keeps admitting until then (a load balancer sees its 503s that much later)


def stop_on_signals(
        signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)) -> threading.Event:
    """An event that any of `signals` sets (call from the main thread)."""
    stop = threading.Event()
    received: queue.SimpleQueue[int] = queue.SimpleQueue()

    def relay() -> None:
        received.get()
        stop.set()

    threading.Thread(target=relay, name="stop-signal-relay", daemon=True).start()
    for sig in signals:
        signal.signal(sig, lambda signum, _frame: received.put(signum))
    return stop


def wait_for_stop(stop: threading.Event, alive: Callable[[], bool] = lambda: True) -> None:
    """Return once `stop` is set (a signal) or `alive()` is false, within POLL_S."""
    while not stop.is_set() and alive():
        stop.wait(POLL_S)
