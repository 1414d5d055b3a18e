"""Ctrl+C and SIGTERM stop a main thread that only waits (control/serve/stop_signals.py), as
`batchpilot fleet` and `make run` wait: also when the kernel hands the signal to another
thread (Ray's threads do not block signals; `batchpilot fleet` once ignored both for
minutes), and when the process inherited SIGINT ignored (started in the background by a
shell without job control). The same script with a plain `Event.wait()` is shown to hang,
so the first test can see the bug it guards against."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = """
import signal, sys, threading, time
from control.serve.stop_signals import stop_on_signals, wait_for_stop
stop = stop_on_signals()
worker = threading.Thread(target=time.sleep, args=(60,), daemon=True)
worker.start()
if sys.argv[1] == "other-thread":  # the signal lands on a thread other than the main one
    threading.Timer(0.3, signal.pthread_kill, (worker.ident, signal.SIGTERM)).start()
print("waiting", flush=True)
if sys.argv[2] == "plain":
    stop.wait()
else:
    wait_for_stop(stop)
print("stopped", flush=True)
"""


def start(*args: str, ignore_sigint: bool = False) -> subprocess.Popen:
    def ignore() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, preexec_fn=ignore if ignore_sigint else None)
    assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
    return proc


def stopped_within(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        out, _ = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return False
    return proc.returncode == 0 and out == "stopped\n"


def test_a_signal_delivered_to_another_thread_stops_the_wait():
    assert stopped_within(start("other-thread", "polled"), 10)
    plain = start("other-thread", "plain")
    assert not stopped_within(plain, 3), "a plain wait saw it: this test shows nothing"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_it_even_with_sigint_inherited_ignored(sig):
    proc = start("main-thread", "polled", ignore_sigint=True)
    time.sleep(0.2)
    proc.send_signal(sig)
    assert stopped_within(proc, 10)


HELD_LOCK_SCRIPT = """
import signal
from control.serve.stop_signals import stop_on_signals, wait_for_stop
stop = stop_on_signals()
with stop._cond:  # the moment of each poll in which the main thread holds the event's lock
    signal.raise_signal(signal.SIGTERM)  # its handler runs here, on the main thread
    print("handled", flush=True)
wait_for_stop(stop)
print("stopped", flush=True)
"""


def test_a_signal_handled_while_the_wait_holds_the_events_lock_still_stops_it():
    proc = subprocess.Popen([sys.executable, "-c", HELD_LOCK_SCRIPT], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE)
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    assert out == "handled\nstopped\n", "the handler waited on the lock its own thread held"


def test_the_wait_ends_when_what_it_watches_dies():
    """`make run` waits on its server and dashboard: when `alive()` turns false (one of
    them exited), the wait returns within POLL_S, without a signal."""
    import threading

    from control.serve.stop_signals import wait_for_stop

    stop = threading.Event()
    waiter = threading.Thread(target=wait_for_stop, args=(stop, lambda: False), daemon=True)
    waiter.start()
    try:
        waiter.join(10)
        assert not waiter.is_alive(), "the wait ignored alive()"
    finally:
        stop.set()
