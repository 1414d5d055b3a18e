"""The failure every `batchpilot ctl` command (and the clients built on its `Client`)
reports: a message for stderr and the exit code it gets (the codes: control/cli/ctl.py).
Its own module, so the commands in other files (ctl_canary.py) import it without
importing the dispatcher that imports them."""

from __future__ import annotations


class CtlError(Exception):
    """A failure to report on stderr, with the exit code it gets."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code
