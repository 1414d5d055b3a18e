"""`python -m control.edge`: the edge process, started by `batchpilot serve` (process.py
is its handle there). Prints EDGE_READY_LINE with its URL once it listens; exits when
told (SIGTERM) or when the server that started it is gone."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import uvicorn

from control.api.limits import RequestLimits
from control.edge.app import create_edge_app
from control.edge.process import EDGE_READY_LINE, PARENT_POLL_S
from control.serve.read_deadlines import ReadDeadlines
from control.serve.settings import KEEP_ALIVE_S, ServeSettings


class EdgeServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, parent: int, host: str):
        super().__init__(config)
        self.parent, self.host = parent, host

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.should_exit:  # e.g. the port was taken: uvicorn logged why
            return
        port = next(sock.getsockname()[1] for server in self.servers
                    for sock in server.sockets)
        url = ServeSettings(host=self.host, port=port).url
        print(f"{EDGE_READY_LINE} at {url}", flush=True)
        asyncio.ensure_future(self._watch_parent())

    async def _watch_parent(self) -> None:
        while not self.should_exit:  # orphaned (the server died hard): nothing to forward to
            if os.getppid() != self.parent:
                self.should_exit = True
            await asyncio.sleep(PARENT_POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="batchpilot's edge process")
    parser.add_argument("--uds", required=True, help="the server's Unix socket")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--limits", required=True, help="RequestLimits as JSON")
    parser.add_argument("--parent", type=int, required=True, help="the server's pid")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    limits = RequestLimits(**json.loads(args.limits)).validate()
    config = uvicorn.Config(create_edge_app(args.uds, limits), host=args.host,
                            port=args.port, log_level=args.log_level, lifespan="on",
                            timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=5,
                            http=ReadDeadlines)
    server = EdgeServer(config, args.parent, args.host)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
