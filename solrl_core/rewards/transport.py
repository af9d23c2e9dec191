"""JSON over HTTP for rewards behind a URL (remote: and vlm:), on the standard library alone.

Every call has one deadline, `timeout_s` from its start, for the whole of it: connecting, sending,
the answer's headers and body, and the retries. At the deadline the connection is shut down, so a
server that trickles its answer a byte at a time cannot hold the call past it (a socket timeout
alone is per read, and would wait as long as the bytes keep coming). A connection error (refused,
reset, closed mid-answer) is retried with back-off, `BACKOFF_S` between tries, while the deadline
allows, then becomes a SolrlError naming the URL; a call that reaches its deadline is not retried
(the server is busy or stuck, and another try would double the wait): it is a SolrlError at once.
An HTTP error status carries the server's reason. The reward watchdog (watchdog.py) wraps all of
this, so the run's own retries and time limit still hold.

What is read of an answer is bounded as well: at most `MAX_ANSWER_BYTES` (a longer answer is
refused from its Content-Length, or after that many bytes), parsed with bounds on its values and
depth (bounded_json.py), so a hostile or broken server costs the client little memory and gives
one line, never a RecursionError.

Redirects are refused, not followed: urllib would send the Authorization header along to wherever a
redirect points, another host included, and a reward server never redirects (a redirect means a
wrong URL, or something in between that should not see the token). The error names the target.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from solrl_core.errors import SolrlError
from solrl_core.io import bounded_json

BACKOFF_S = (0.25, 0.5, 1.0, 2.0)  # sleeps between connection attempts: five tries over about 4 s
# The largest answer read: a /score answer for 512 images of ten rewards is under 200 KB, a hosted
# API's model list tens of KB.
MAX_ANSWER_BYTES = 16 * 2**20
MAX_ANSWER_ITEMS = 1 << 18  # JSON tokens of one answer (bounded_json): a few MB of Python objects at most
MAX_ANSWER_DEPTH = 64


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        raise SolrlError(f"{req.full_url} answered with a redirect (HTTP {code}) to {newurl}; redirects are not "
                         f"followed, "
                         "so the token is never sent on to another address", "give the address the server answers at "
                         "itself (check the scheme, host, port and path)")


class HttpError(SolrlError):
    """The server answered with an error status. `status` is the HTTP code."""

    def __init__(self, status: int, message: str, fix: str) -> None:
        super().__init__(message, fix)
        self.status = status


class Unreachable(SolrlError):
    """No connection to the server after every try. Its fix is for a run that was under way; before a
    run starts, the caller says what to do instead (`START`, then the same command again)."""

    START = "start the server (or check the URL and the network)"


class _Deadline:
    """One deadline for a whole call: past it, the connection in use is shut down, which ends any
    read in progress (a per-read socket timeout never fires while a server trickles bytes)."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.passed = False
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        def cut() -> None:
            with self.lock:
                if self.timer is None:  # stopped meanwhile
                    return
                self.passed = True
                try:  # socket.socket's own shutdown: an SSL socket's would also drop its TLS state under the reader
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass

        self.stop()
        with self.lock:
            self.timer = threading.Timer(self.left(), cut)
            self.timer.daemon = True
            self.timer.start()

    def stop(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None


class _Watched:
    """An HTTP(S) handler whose connections the deadline watches from the moment they connect."""

    deadline: _Deadline

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        deadline = self.deadline

        class Connection(http_class):  # type: ignore[misc, valid-type]
            def connect(self) -> None:
                super().connect()
                deadline.watch(self.sock)

        return super().do_open(Connection, req, **kwargs)  # type: ignore[misc]


class _Http(_Watched, urllib.request.HTTPHandler):
    pass


class _Https(_Watched, urllib.request.HTTPSHandler):
    pass


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    handlers = [_Http(), _Https()]
    for handler in handlers:
        handler.deadline = deadline
    return urllib.request.build_opener(_RefuseRedirects, *handlers)


def call(url: str, body: Any | None, *, timeout_s: float, token: str = "", what: str = "",
         backoff: tuple[float, ...] = BACKOFF_S) -> tuple[Any, float]:
    """GET (body None) or POST JSON `body` to `url`; the decoded JSON answer and the seconds it took."""
    what = what or url
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    deadline = _Deadline(timeout_s)
    late = SolrlError(f"{what} did not answer within {timeout_s:g} s", "check the server's load and log; raise "
                      "reward.timeout_s if it is only slow")
    opener = _opener(deadline)
    for attempt in range(len(backoff) + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
        t0 = time.perf_counter()
        try:
            with opener.open(request, timeout=max(deadline.left(), 0.001)) as answer:
                raw = _read(answer, what)
            if deadline.passed:  # the body was cut short at the deadline
                raise late
            return _json(raw, what), time.perf_counter() - t0
        except urllib.error.HTTPError as exc:
            raise _http_error(exc, what) from None
        except (TimeoutError, socket.timeout) as exc:
            raise late from exc
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, (TimeoutError, socket.timeout)) or deadline.passed:
                raise late from exc
            if attempt == len(backoff) or deadline.left() <= backoff[attempt]:
                raise Unreachable(f"{what} is not reachable ({type(reason).__name__}: {reason}; {attempt + 1} tries "
                                  f"over {sum(backoff[:attempt]):g} "
                                  f"s)", f"{Unreachable.START}, then continue a run with "
                                  "`solrl train --resume RUN --trust-run-config`") from exc
            time.sleep(backoff[attempt])
        finally:
            deadline.stop()
    raise AssertionError("unreachable")


def _read(answer: Any, what: str, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """The answer's body, refused past `limit` bytes: from its Content-Length before reading, or once
    more than that has come."""
    declared = answer.headers.get("Content-Length", "")
    too_long = SolrlError(f"{what} answered with more than {limit} bytes, more than any answer of a reward server or "
                          f"VLM "
                          "API holds", "check that the URL points at the server's base address")
    if declared.isdigit() and int(declared) > limit:
        raise too_long
    raw = answer.read(limit + 1)
    if len(raw) > limit:
        raise too_long
    return raw


def _json(raw: bytes, what: str) -> Any:
    try:
        return bounded_json.loads(raw, max_items=MAX_ANSWER_ITEMS, max_depth=MAX_ANSWER_DEPTH)
    except bounded_json.JsonTooLarge as exc:
        raise SolrlError(f"{what} answered with a body that {exc}, more than any answer of a reward server or VLM API",
                         "check that the URL points at the server's base address") from exc
    except ValueError as exc:
        raise SolrlError(f"{what} answered with something that is not JSON ({raw[:80]!r})",
                         "check that the URL points at the server's base address") from exc


def _http_error(exc: urllib.error.HTTPError, what: str) -> HttpError:
    try:
        answer = bounded_json.loads(exc.read(MAX_ANSWER_BYTES) or b"{}", max_items=MAX_ANSWER_ITEMS,
                                    max_depth=MAX_ANSWER_DEPTH)
        error = answer.get("error")  # OpenAI-style APIs: {"error": {"message": ...}}
        detail = error.get("message", "") if isinstance(error, dict) else answer.get("detail", "")
        fix = answer.get("fix", "")
    except (ValueError, AttributeError, OSError, http.client.HTTPException):  # no reason to be read: the status says it
        detail, fix = "", ""
    reason = detail if isinstance(detail, str) and detail else json.dumps(detail) if detail else exc.reason
    fixes = {401: "set the token in the environment: SOLRL_REWARD_TOKEN for a reward server, OPENAI_API_KEY for a vlm: "
                  "endpoint",
             404: "check the URL: give the server's base address (for a vlm: endpoint, the one ending in /v1)",
             413: "send fewer or smaller images per request (reward.batch_size), or start the server with larger "
                  "limits"}
    return HttpError(exc.code, f"{what} refused the request: HTTP {exc.code}: {reason}",
                     fix if isinstance(fix, str) and fix
                     else fixes.get(exc.code, "see the server's log (SOLRL_DEBUG=1 there for the traceback)"))
