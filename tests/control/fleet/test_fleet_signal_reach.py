"""Noticing that a stop signal reached the local Ray's processes too (signal_reach.py)."""

import os
import signal
import subprocess
import sys
import time

from control.fleet.signal_reach import child_processes, exited, reach_warning


def test_a_child_that_exits_on_the_signal_is_named_zombie_or_reaped(tmp_path):
    script = tmp_path / "log_monitor.py"  # a Python child is named by its script, as Ray's
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    sleeper = subprocess.Popen([sys.executable, "-u", str(script), "--x=1"],
                               stdout=subprocess.PIPE)
    survivor = subprocess.Popen(["sh", "-c", "echo up; exec sleep 60"], stdout=subprocess.PIPE)
    try:
        assert sleeper.stdout.readline() == survivor.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 10  # until the shell has exec'd sleep
        while (before := child_processes()).get(survivor.pid) != "sleep" \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert before[sleeper.pid] == "log_monitor" and before[survivor.pid] == "sleep"
        assert exited(before) == []
        os.kill(sleeper.pid, signal.SIGTERM)
        os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        assert exited(before) == ["log_monitor"]  # a zombie counts as exited
        sleeper.wait()
        assert exited(before) == ["log_monitor"]  # and so does one reaped
    finally:
        for proc in (sleeper, survivor):
            proc.kill()
            proc.wait()


def test_child_processes_of_another_pid_and_the_warning_says_what_to_do():
    assert os.getpid() in child_processes(os.getppid())
    text = reach_warning(["gcs_server", "raylet"])
    assert "gcs_server, raylet" in text and "KillMode=mixed" in text
    assert "timeout --foreground" in text
