"""JSON over HTTP for rewards behind a URL (remote: and vlm:), on the standard library alone.

Every request has a time limit. A connection error (refused, reset, closed mid-answer) is retried
with back-off, `BACKOFF_S` between tries, then becomes a SolrlError naming the URL; a request that
runs past its limit is not retried (the server is busy or stuck, and another try would double the
wait): it is a SolrlError at once. An HTTP error status carries the server's reason. The reward
watchdog (watchdog.py) wraps all of this, so the run's own retries and time limit still hold.

Redirects are refused, not followed: urllib would send the Authorization header along to wherever a
redirect points, another host included, and a reward server never redirects (a redirect means a
wrong URL, or something in between that should not see the token). The error names the target.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from solrl_core.errors import SolrlError

BACKOFF_S = (0.25, 0.5, 1.0, 2.0)  # sleeps between connection attempts: five tries over about 4 s


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        raise SolrlError(f"{req.full_url} answered with a redirect (HTTP {code}) to {newurl}; redirects are not followed, "
                         "so the token is never sent on to another address", "give the address the server answers at "
                         "itself (check the scheme, host, port and path)")


class HttpError(SolrlError):
    """The server answered with an error status. `status` is the HTTP code."""

    def __init__(self, status: int, message: str, fix: str) -> None:
        super().__init__(message, fix)
        self.status = status


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
    opener = urllib.request.build_opener(_RefuseRedirects)
    for attempt in range(len(backoff) + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
        t0 = time.perf_counter()
        try:
            with opener.open(request, timeout=timeout_s) as answer:
                raw = answer.read()
            return _json(raw, what), time.perf_counter() - t0
        except urllib.error.HTTPError as exc:
            raise _http_error(exc, what) from None
        except (TimeoutError, socket.timeout) as exc:
            raise SolrlError(f"{what} did not answer within {timeout_s:g} s", "check the server's load and log; raise "
                             "reward.timeout_s if it is only slow") from exc
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise SolrlError(f"{what} did not answer within {timeout_s:g} s", "check the server's load and log; raise "
                                 "reward.timeout_s if it is only slow") from exc
            if attempt == len(backoff):
                raise SolrlError(f"{what} is not reachable ({type(reason).__name__}: {reason}; {attempt + 1} tries over "
                                 f"{sum(backoff):g} s)", "start the server (or check the URL and the network), then "
                                 "continue with `solrl train --resume RUN`") from exc
            time.sleep(backoff[attempt])
    raise AssertionError("unreachable")


def _json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise SolrlError(f"{what} answered with something that is not JSON ({raw[:80]!r})",
                         "check that the URL points at the server's base address") from exc


def _http_error(exc: urllib.error.HTTPError, what: str) -> HttpError:
    try:
        answer = json.loads(exc.read() or b"{}")
        error = answer.get("error")  # OpenAI-style APIs: {"error": {"message": ...}}
        detail = error.get("message", "") if isinstance(error, dict) else answer.get("detail", "")
        fix = answer.get("fix", "")
    except (ValueError, AttributeError):
        detail, fix = "", ""
    reason = detail if isinstance(detail, str) and detail else json.dumps(detail) if detail else exc.reason
    fixes = {401: "set the token in the environment: SOLRL_REWARD_TOKEN for a reward server, OPENAI_API_KEY for a vlm: endpoint",
             404: "check the URL: give the server's base address (for a vlm: endpoint, the one ending in /v1)",
             413: "send fewer or smaller images per request (reward.batch_size), or start the server with larger limits"}
    return HttpError(exc.code, f"{what} refused the request: HTTP {exc.code}: {reason}", fix if isinstance(fix, str) and fix
                     else fixes.get(exc.code, "see the server's log (SOLRL_DEBUG=1 there for the traceback)"))
