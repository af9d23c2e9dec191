"""`solrl reward-server`: built-in rewards (one, or a weighted combination) over HTTP, JSON only.

Endpoints (schema 1, wire.py holds the image and score formats):
  GET  /health  the rewards (name, weight, description), versions, device, batch size, limits and identity
  GET  /info    what it serves: name, version, each reward's weight and fingerprint (identity.py)
  POST /check   {"prompts": [...]} -> 200 {"ok": true}, or 422 naming the first prompt a reward cannot judge
  POST /score   {"prompts": [...], "images": [...]} -> {"total": [...], "scores": {name: [...]}, "seconds": s}
                or {"prompts": [...], "videos": [{"frames": [...]}, ...], "video_frames": 0, "frame_reduce": "mean"}:
                a video model's clips, scored as an in-process RewardSet scores them (wire.py); /health's "media" says
                which of the two the served rewards judge, and the other is refused (422)

Requests from all clients meet in one queue; one worker thread scores them in order, merging
queued requests of the same image size into one batch of up to `batch_size` images (one forward
pass of a model reward). A merged batch that fails is scored again request by request, so one
client's bad request fails only that request. Limits (limits.py, each derived from the largest
legitimate request) are checked before anything is decoded: the body size (Content-Length, 413,
before the body is read), images per request (413), pixels per side from the declared shape or the
PNG header (422), decoded bytes per request (413), JSON values and depth before the body is built
(413, 400); a malformed body (not JSON, a wrong field) is a 400 or 422 naming what is wrong. The
decoded pixels of all requests in flight share one budget (limits.InFlight): a request is decoded
when there is room for it. A 4xx never reaches the scoring thread, and a
refusal before the body closes the connection. Slow headers and bodies time out and open
connections are capped (http_guard.py); repeated log lines are rate-limited.

The server binds to loopback by default. Any other address needs a token (--token or
SOLRL_REWARD_TOKEN), and then every request must send `Authorization: Bearer TOKEN` (401 otherwise).
FastAPI and uvicorn are the `server` extra: `pip install "solrl[server]"`.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations (Request, imported
# lazily inside build_app) as live objects.
import concurrent.futures
import hmac
import ipaddress
import platform
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from solrl_core.errors import SolrlError
from solrl_core.io import bounded_json
from solrl_core.io.bounded_json import JsonTooLarge
from solrl_core.rewards import RewardSet, Scores
from solrl_core.rewards.base import RewardContext
from solrl_core.rewards.identity import server_identity
from solrl_core.rewards.limits import MAX_JSON_DEPTH, InFlight, Limits, derive
from solrl_core.rewards.names import FRAME_REDUCTIONS, judged_media
from solrl_core.rewards.registry import lookup
from solrl_core.rewards.wire import FORMATS, SCHEMA, TooLarge, frame_count, read_clips, read_images, scores_to_json


@dataclass(frozen=True)
class ServerOptions:
    weights: dict[str, float]
    host: str = "127.0.0.1"
    port: int = 8000  # 0 = any free port (the ready callback names it)
    device: str = "auto"
    token: str = ""
    batch_size: int = 32  # images per scoring call; queued requests are merged up to this
    max_images: int = 512  # per request
    max_side: int = 0  # pixels per image side; 0 = derived from the rewards (limits.py)
    max_decoded_mb: float = 0.0  # decoded float32 pixels per request and in flight; 0 = limits.DEFAULT_DECODED_MB
    max_request_mb: float = 0.0  # body size; 0 = derived from the largest legitimate request
    header_timeout_s: float = 0.0  # 0 = limits.DEFAULT_HEADER_TIMEOUT_S
    max_connections: int = 0  # 0 = half the open-file limit, at most 512
    paths: dict[str, str] = field(default_factory=dict)


@dataclass
class _Job:
    images: torch.Tensor
    prompts: list[str]
    frames: dict[str, Any] = field(default_factory=dict)  # a clip request's video_frames and frame_reduce
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class Batcher:
    """One worker thread scoring queued jobs, merging those of one image size up to `batch_size` images."""

    def __init__(self, score: Callable[..., Scores], batch_size: int) -> None:
        self.score, self.batch_size = score, batch_size
        self.jobs: queue.Queue[_Job] = queue.Queue()
        self.batches: list[int] = []  # images per scoring call, for tests and /health
        threading.Thread(target=self._work, name="solrl-reward-server", daemon=True).start()

    def submit(self, images: torch.Tensor, prompts: list[str],
               frames: dict[str, Any] | None = None) -> concurrent.futures.Future:
        job = _Job(images, prompts, frames or {})
        self.jobs.put(job)
        return job.future

    def _work(self) -> None:
        waiting: _Job | None = None
        while True:
            first = waiting or self.jobs.get()
            waiting, batch, count = None, [first], len(first.prompts)
            while count < self.batch_size:
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if job.images.shape[1:] != first.images.shape[1:] or job.frames != first.frames \
                        or count + len(job.prompts) > self.batch_size:
                    waiting = job  # first of the next batch: order is kept
                    break
                batch.append(job)
                count += len(job.prompts)
            self._run(batch)
            # freed now, not when the next request arrives: the server's room for it is already given back
            for job in batch:
                job.images = torch.empty(0)

    def _run(self, batch: list[_Job]) -> None:
        try:
            images = batch[0].images if len(batch) == 1 else torch.cat([j.images for j in batch])
            scores = self.score(images, [p for j in batch for p in j.prompts], **batch[0].frames)
        except Exception as exc:  # noqa: BLE001 - handed to the request(s) it belongs to, which answer 500 with it
            if len(batch) > 1:
                for job in batch:
                    self._run([job])
                return
            batch[0].future.set_exception(exc)
            return
        self.batches.append(sum(len(j.prompts) for j in batch))
        start = 0
        for job in batch:
            end = start + len(job.prompts)
            job.future.set_result(Scores(scores.total[start:end],
                                         {n: s[start:end] for n, s in scores.components.items()}))
            start = end


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        solrl = version("solrl")
    except PackageNotFoundError:
        solrl = "unknown"
    return {"solrl": solrl, "torch": torch.__version__, "python": platform.python_version()}


def load(opts: ServerOptions) -> tuple[RewardSet, dict[str, Any], Limits]:
    """The rewards, loaded on the resolved device, the /health answer describing them, and the limits."""
    from solrl_core.rewards.endpoints import is_endpoint
    from solrl_core.runtime.device import resolve_device

    if not opts.token and not is_loopback(opts.host):
        raise SolrlError(f"serving on {opts.host} (not loopback) without a token would let anyone who reaches it use "
                         f"this machine",
                         "pass --token TOKEN (or set SOLRL_REWARD_TOKEN), or bind to 127.0.0.1")
    served = [n for n in opts.weights if is_endpoint(n)]
    if served:
        raise SolrlError(f"a reward server serves built-in rewards and plugins, not '{served[0]}'",
                         "name built-in rewards or plugins: see `solrl presets`")
    device = resolve_device(opts.device)
    rewards = RewardSet(opts.weights, RewardContext(device, torch.float32, batch_size=opts.batch_size),
                        paths=opts.paths)
    limits = derive(rewards.rewards.values(), max_images=opts.max_images, max_side=opts.max_side,
                    max_decoded_mb=opts.max_decoded_mb, max_request_mb=opts.max_request_mb,
                    header_timeout_s=opts.header_timeout_s, max_connections=opts.max_connections)
    described = {n: info.description for n in opts.weights if (info := lookup(n)) is not None}
    versions = _versions()
    info = {"schema": SCHEMA, "server": "solrl reward-server", "device": str(device), "versions": versions,
            "rewards": [{"name": n, "weight": w, "description": described.get(n, "")} for n, w in opts.weights.items()],
            "batch_size": opts.batch_size, **limits.describe(), "formats": list(FORMATS),
            "token_required": bool(opts.token),
            "media": judged_media(list(opts.weights)),
            "identity": server_identity(rewards.rewards, opts.weights, versions["solrl"])}
    return rewards, info, limits


def build_app(rewards: RewardSet, info: dict[str, Any], opts: ServerOptions, limits: Limits) -> Any:
    """The ASGI app serving `rewards`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    app = FastAPI(title="solrl reward server", version=info["versions"]["solrl"], docs_url=None, redoc_url=None)
    batcher = Batcher(rewards, opts.batch_size)
    app.state.batcher = batcher
    in_flight = InFlight(limits.max_decoded_bytes)

    def refuse(status: int, detail: str, fix: str = "", close: bool = False) -> JSONResponse:
        """`close`: refused before the body was read, so the connection closes rather than wait for it."""
        return JSONResponse({"detail": detail, **({"fix": fix} if fix else {})}, status_code=status,
                            headers={"Connection": "close"} if close else None)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        sent = request.headers.get("authorization", "")
        if opts.token and not hmac.compare_digest(sent.encode(), f"Bearer {opts.token}".encode()):
            return refuse(401, "missing or wrong token: send the header 'Authorization: Bearer TOKEN'", close=True)
        if request.method == "POST":
            length = request.headers.get("content-length", "")
            if not length.isdigit():
                return refuse(411, "send the body with a Content-Length header", close=True)
            if int(length) > limits.max_request_bytes:
                return refuse(413, f"request of {int(length)} bytes is more than the server's "
                                   f"{limits.max_request_bytes}",
                              close=True)
        return await call_next(request)

    async def body_of(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await run_in_threadpool(bounded_json.loads, await request.body(), max_items=limits.max_json_items,
                                           max_depth=MAX_JSON_DEPTH)
        except JsonTooLarge as exc:
            return refuse(400 if exc.deep else 413, f"body {exc}",
                          "" if exc.deep else f"send at most {limits.max_images} images per request, as /health says")
        except ValueError as exc:
            return refuse(400, f"body is not JSON ({exc})")
        if not isinstance(body, dict) or not isinstance(body.get("prompts"), list) \
                or not all(isinstance(p, str) for p in body["prompts"]):
            return refuse(422, "body must be an object with 'prompts', a list of strings")
        return body

    def check(prompts: list[str]) -> JSONResponse | None:
        try:
            rewards.check_prompts(prompts)
        except SolrlError as exc:
            return refuse(422, exc.message, exc.fix)
        return None

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {**info, "batches_scored": len(batcher.batches)}

    @app.get("/info")
    async def identity() -> dict[str, Any]:
        return info["identity"]

    @app.post("/check")
    async def check_prompts(request: Request) -> Any:
        body = await body_of(request)
        if isinstance(body, JSONResponse):
            return body
        return await run_in_threadpool(check, body["prompts"]) or {"ok": True}

    @app.post("/score")
    async def score(request: Request) -> Any:
        body = await body_of(request)
        if isinstance(body, JSONResponse):
            return body
        prompts, video = body["prompts"], "videos" in body
        items, reduce, sampled = body.get("videos" if video else "images"), body.get("frame_reduce",
                "mean"), body.get("video_frames", 0)
        media = "video" if video else "image"
        if media not in info["media"]:
            return refuse(422, f"this server's rewards ({', '.join(opts.weights)}) do not judge {media}s",
                          "send them to a server of rewards that do (its /health names them under 'media')")
        if video and reduce not in FRAME_REDUCTIONS:
            return refuse(422, f"frame_reduce {str(reduce)[:40]!r} is not one of {', '.join(FRAME_REDUCTIONS)}")
        if video and not (type(sampled) is int and sampled >= 0):
            return refuse(422, f"video_frames {str(sampled)[:40]!r} is not a whole number >= 0")
        count = frame_count(items) if video else len(items) if isinstance(items, list) else 0
        if count > limits.max_images:
            return refuse(413, f"{count} {'frames' if video else 'images'} in one request; the server takes at most "
                               f"{limits.max_images}")
        if isinstance(items, list) and len(items) != len(prompts):
            return refuse(422, f"{len(items)} {'videos' if video else 'images'} but {len(prompts)} prompts")
        try:
            pending = await run_in_threadpool(read_clips if video else read_images, items, limits.max_side,
                                              limits.max_decoded_bytes)
        except TooLarge as exc:
            return refuse(413, str(exc))
        except ValueError as exc:
            return refuse(422, str(exc))
        refused = await run_in_threadpool(check, prompts)
        if refused is not None:
            return refused
        async with in_flight.hold(pending.decoded_bytes):  # decoded and scored only when the server holds room for it
            try:
                images = await run_in_threadpool(pending.decode)
            except ValueError as exc:
                return refuse(422, str(exc))
            t0 = time.perf_counter()
            try:
                frames = {"video_frames": sampled, "frame_reduce": reduce} if video else {}
                scores = await _wait(batcher.submit(images, prompts, frames))
            except Exception as exc:  # noqa: BLE001 - the reward's own failure, told to the client that sent the batch
                return refuse(500, f"scoring failed: {type(exc).__name__}: {exc}")
            finally:
                del images  # the decoded pixels go before the next request's room is granted
        return {"total": scores_to_json(scores.total), "seconds": time.perf_counter() - t0,
                "scores": {n: scores_to_json(s) for n, s in scores.components.items()}}

    return app


async def _wait(future: concurrent.futures.Future) -> Scores:
    import asyncio

    return await asyncio.wrap_future(future)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a SolrlError saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SolrlError(f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                         "choose another --port, or stop what holds it" if port else "check --host") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def prepare(opts: ServerOptions) -> tuple[Any, socket.socket, str, dict[str, Any]]:
    """Load the rewards and listen: the uvicorn server (not yet serving), its socket, its URL and the
    /health answer. `serve` runs it until interrupted; the doctor's self-test in a thread, until told."""
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise SolrlError(f"the reward server needs FastAPI and uvicorn ({exc})", 'install them with `pip install '
                                                                                 '"solrl[server]"`') from exc
    from solrl_core.rewards.http_guard import guarded_protocol, quiet_logging

    rewards, info, limits = load(opts)
    sock = bind(opts.host, opts.port)
    host, port = sock.getsockname()[:2]
    app = build_app(rewards, info, opts, limits)
    quiet_logging()
    # uvicorn's own limits where it has them; `limit_concurrency` is left off: it counts open connections,
    # so half-open ones would make it refuse real requests (the guarded protocol caps connections instead).
    server = uvicorn.Server(uvicorn.Config(app, http=guarded_protocol(limits), log_config=None, log_level="warning",
                                           access_log=False, timeout_keep_alive=5,
                                           h11_max_incomplete_event_size=16 * 1024,
                                           backlog=limits.backlog))
    return server, sock, f"http://{f'[{host}]' if ':' in host else host}:{port}", info


def serve(opts: ServerOptions, on_ready: Callable[[str, dict[str, Any]], None]) -> None:
    """Load the rewards, listen, call `on_ready(url, info)`, then serve until interrupted."""
    server, sock, url, info = prepare(opts)
    on_ready(url, info)
    server.run(sockets=[sock])
