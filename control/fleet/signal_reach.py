"""Whether a stop signal meant for `batchpilot fleet` also reached the local Ray it started.

A local Ray's node processes (gcs_server, raylet, its Python helpers) are this process's
children in its process group. Ctrl+C reaches all of them, and Ray blocks SIGINT in them,
so the fleet drains. A SIGTERM sent to the whole process group (`timeout` without
`--foreground`) or to the whole cgroup (systemd's default KillMode=control-group) stops
some of them at once. The drain then waits on a control plane that is going away: 30-90 s
here instead of ~7, with Ray's own errors, and requests still in flight can be lost. This
module notices that the signal reached them, so the fleet can say so and what to do.
Linux only (/proc); elsewhere it sees no children and says nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def child_processes(pid: int | None = None, proc: Path = PROC) -> dict[int, str]:
    """{pid: command name} of the live (not zombie) direct children of `pid` (default:
    this process)."""
    parent = os.getpid() if pid is None else pid
    children = {}
    for entry in proc.glob("[0-9]*"):
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        state, ppid = text[text.rindex(")") + 2:].split()[:2]
        if int(ppid) == parent and state != "Z":
            script = _script_of(entry) if name.startswith("python") else ""
            children[int(entry.name)] = script or name
    return children


def _script_of(entry: Path) -> str:
    """A Python process's script name (Ray's helpers: monitor, dashboard, log_monitor), ""
    for none."""
    try:
        args = (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    scripts = [a for a in args[1:] if a.endswith(b".py")]
    return Path(scripts[0].decode(errors="replace")).stem if scripts else ""


def exited(children: dict[int, str], proc: Path = PROC) -> list[str]:
    """The names of `children` (child_processes' answer, earlier) that have exited since:
    gone, or a zombie their parent has not reaped yet."""
    now = child_processes(proc=proc)
    return sorted(name for pid, name in children.items() if pid not in now)


def reach_warning(names: list[str]) -> str:
    return (f"the stop signal also reached the local Ray's own processes ({', '.join(names)}"
            " exited with it): it was sent to the whole process group or cgroup (`timeout`"
            " without --foreground, systemd's default KillMode=control-group). The drain may"
            " take up to ~90 s and lose requests in flight. Signal only this process:"
            " `timeout --foreground`, systemd KillMode=mixed (docs/fleet.md)")
