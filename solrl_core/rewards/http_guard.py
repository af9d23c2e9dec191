"""What uvicorn does not bound on its own: header and body timeouts, a cap on open connections, and
a log that repeats itself.

uvicorn's settings are used where they exist (server.py): `timeout_keep_alive` closes idle kept-alive
connections, `h11_max_incomplete_event_size` bounds the request line and headers (16 KiB),
`limit_concurrency` answers 503 past a number of requests in flight, `backlog` bounds the kernel's
queue. It has no timeout for a request's headers or body and accepts every connection, so a client
that opens many and sends only a request line holds a descriptor each, forever: at the descriptor
limit every accept fails, and asyncio logs each failure. `guarded_protocol` adds, on uvicorn's h11
protocol (the server's one HTTP implementation; `http="h11"`):
- a deadline for the headers, from the connection (or the next request's first byte), and one for
  the body (limits.Limits.body_deadline_s); a connection past its deadline is closed;
- a cap on open connections: past it, the one waiting longest for its headers is closed (or, when
  every connection is busy with a request, the new one, with a 503).
`RepeatFilter` lets the first few copies of a log line through per minute, then counts the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from solrl_core.rewards.limits import Limits

BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: "
        b"33\r\n\r\ntoo many connections; retry later")


def guarded_protocol(limits: Limits) -> type:
    """uvicorn's h11 protocol with header and body deadlines and a connection cap."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.deadline: Any = None
            self.phase = ""
            self.opened = time.monotonic()
            self._arm("head", limits.header_timeout_s)
            if len(self.connections) > limits.max_connections:
                waiting = [c for c in self.connections if c is not self and getattr(c, "phase", "") == "head"]
                if waiting:
                    min(waiting, key=lambda c: c.opened).expire()
                else:
                    transport.write(BUSY)
                    self.expire()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            state = self.conn.their_state
            if state is h11.IDLE and self.phase != "head":  # the first byte of a kept-alive connection's next request
                self.opened = time.monotonic()
                self._arm("head", limits.header_timeout_s)
            elif state is h11.SEND_BODY and self.phase != "body":
                length = dict(self.headers or []).get(b"content-length", b"0")
                self._arm("body", limits.body_deadline_s(int(length) if length.isdigit() else 0))
            elif state not in (h11.IDLE, h11.SEND_BODY):  # the whole request is in: the app has it
                self._arm("", 0.0)

        def connection_lost(self, exc: Exception | None) -> None:
            self._arm("", 0.0)
            super().connection_lost(exc)

        def _arm(self, phase: str, seconds: float) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            self.phase, self.deadline = phase, (self.loop.call_later(seconds, self.expire) if phase else None)

        def expire(self) -> None:
            self._arm("", 0.0)
            self.connections.discard(self)
            if not self.transport.is_closing():
                self.transport.close()

    return Guarded


class RepeatFilter(logging.Filter):
    """Lets `burst` copies of each log line through per `window_s`, then one note, then nothing until
    the window ends; the next copy after it says how many were held back. At most `total` lines
    of any kind per window, so lines that differ a little each time cannot flood the log either."""

    def __init__(self, burst: int = 5, window_s: float = 60.0, total: int = 200) -> None:
        super().__init__()
        self.burst, self.window_s, self.total = burst, window_s, total
        self.lock = threading.Lock()
        self.start = time.monotonic()
        self.seen: dict[tuple[str, str], int] = {}
        self.held: dict[tuple[str, str], int] = {}
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        with self.lock:
            now = time.monotonic()
            if now - self.start > self.window_s:
                self.start, self.seen, self.count = now, {}, 0
            n = self.seen[key] = self.seen.get(key, 0) + 1
            self.count += 1
            if n > self.burst or self.count > self.total:
                self.held[key] = self.held.get(key, 0) + 1
                if n == self.burst + 1:
                    held = f"{str(record.msg)[:200]} (repeated; further copies held back for {self.window_s:g} s)"
                    record.msg, record.args, record.exc_info, record.exc_text = held, (), None, None
                    return self.count <= self.total
                return False
            held = self.held.pop(key, 0)
        if held:
            record.msg = f"{record.msg} ({held} copies held back since the last one shown)"
        return True


def quiet_logging() -> None:
    """The server process's log: warnings and errors on stderr, each line rate-limited (RepeatFilter)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
