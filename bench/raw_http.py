"""One HTTP/1.1 request over a raw socket, bytes exactly as given: the malformed requests an
HTTP client refuses to send (control characters and raw UTF-8 in headers, a body that does
not match its Content-Type) go out as they are. For hostile_traffic's poison phase.

    status, answer = await send(host, port, head, body, chunked=False, timeout_s=60)

`head`: the request line and headers, ending in an empty line ("Connection: close" in it:
the answer is read to the server's close). status: the HTTP status, "no_answer" (refused,
closed or reset before a status line) or "timeout".
"""

from __future__ import annotations

import asyncio
import contextlib

WRITE_CHUNK = 64 * 1024


async def send(host: str, port: int, head: bytes, body: bytes, *, chunked: bool,
               timeout_s: float) -> tuple[int | str, bytes]:
    """-> (status, the answer's first bytes). The body is written while the answer is
    read: a server may answer (a 413) before it has read the body, and close."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:  # refused: the server is gone
        return "no_answer", b""

    async def write() -> None:
        writer.write(head)
        for start in range(0, max(len(body), 1), WRITE_CHUNK):
            chunk = body[start:start + WRITE_CHUNK]
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    writing = asyncio.ensure_future(write())
    try:
        answer = await asyncio.wait_for(_read_answer(reader), timeout_s)
    except asyncio.TimeoutError:
        return "timeout", b""
    except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return "no_answer", b""
    finally:
        writing.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await writing
        writer.close()
    status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/") else b""
    return (int(status) if status.isdigit() else "no_answer"), answer


async def _read_answer(reader: asyncio.StreamReader, limit: int = 16_384) -> bytes:
    """The answer's status line, headers and body up to `limit` bytes (or to its close)."""
    answer = await reader.readuntil(b"\r\n\r\n")
    with contextlib.suppress(ConnectionError, OSError):
        while len(answer) < limit and (more := await reader.read(limit - len(answer))):
            answer += more
    return answer
