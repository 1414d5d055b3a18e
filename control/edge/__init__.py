"""The edge: a process of its own in front of the server that refuses malformed requests
before they reach the engine's process.

    client -> edge (public host:port; own process, own GIL)
                validates: body size, JSON, the request schemas, model-free limits
                refuses:   the same 4xx the server gives, with the same bodies
                forwards:  everything else, bytes as received, answers streamed back
           -> server (a Unix socket only it and this user can reach; engine thread +
              event loop)

Why a process: parsing a megabyte of JSON, a 100k-deep nesting or a thousand-entry list
holds the GIL for milliseconds in C (json, pydantic-core), and the engine thread waits that
long for its next step; at 70 malformed requests a second beside innocent ones it tripled
their p99 TPOT (bench/RESULTS.md, "Malformed requests beside innocent ones"). In another
process that work costs a core's time, not the engine's turn.

The server checks everything again (it never trusts the edge for validity); the edge
adds one trusted header, the seconds the request spent in the edge (arrival.py), so
TTFT still counts from the client's arrival. `batchpilot serve --edge auto` (the default)
runs it when the server binds a host other than loopback; `--edge on|off` decides.
"""
