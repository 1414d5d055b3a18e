"""What the load generator itself costs the machine it runs on.

A streaming client that parses every chunk as it arrives (httpx) took ~170 us of CPU a
chunk on this project's 2-core test machine, a tenth of the machine at a loaded server's
rate; the load tester's transport for a server on its own machine (sse_transport) takes
~40 us. When the server runs on the same machine, that CPU is taken from the server (on a
CPU engine whose threads fill every core, each core-second a client holds stalls the
engine's parallel regions for as long), so the figures understate what the server does
for clients elsewhere. The report says how much CPU the run's client used, and warns
when it shared a loopback server's machine and used a visible share of it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from control.serve.settings import LOOPBACK_HOSTS

WARN_SHARE = 0.03  # of the machine's CPU: above this a same-machine run is flagged


@dataclass(frozen=True)
class ClientCost:
    cpu_s: float  # the load generator process's CPU seconds over the runs (all threads)
    wall_s: float  # the runs' wall seconds
    cores: int  # CPUs this process may run on

    @property
    def machine_share(self) -> float:
        """The client's CPU over what the machine's cores had in the runs' time."""
        return self.cpu_s / (self.wall_s * self.cores) if self.wall_s > 0 else 0.0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def same_machine(url: str) -> bool:
    """Whether `url`'s host is this machine: a loopback address or name, or this host's
    own name. (A local address reached by another name is not detected.)"""
    host = (urlsplit(url).hostname or "").lower()
    if host in (*LOOPBACK_HOSTS, socket.gethostname().lower()) or host.endswith(".localhost"):
        return True
    try:  # the rest of 127.0.0.0/8
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cost_notes(cost: ClientCost, url: str) -> tuple[str, str | None]:
    """(the report's line on the client's CPU, a warning or None)."""
    share = cost.machine_share
    note = (f"load generator: {cost.cpu_s:.2f} CPU s over {cost.wall_s:.1f} s of runs,"
            f" {share:.1%} of this machine's {cost.cores} cores")
    if not same_machine(url) or share < WARN_SHARE:
        return note, None
    return note, (f"the load generator ran on the server's machine ({url}) and took"
                  f" {share:.1%} of its {cost.cores} cores from it: the server's figures are"
                  " lower than clients on other machines would see")
