"""The reward server's limits, each derived from what a legitimate request needs.

Image size. The server scores what a run's model generates: the largest shipped model preset
generates 1024x1024 (SANA, SD3), so `DEFAULT_MAX_SIDE` is twice that, 2048 pixels per side. A
reward that resizes its input to S pixels (CLIP-family rewards: 224) never needs more than a few
times S; the limit is the larger of the two, `SIDE_FACTOR` x S or 2048 (`--max-side` sets it). A reward
whose own work grows with every pixel it is sent (the world rewards judge each pixel: two 2048x2048
images cost tinyworld_geneval 1 GB) declares the largest side it scores, `max_side`, and the server
refuses a larger image before decoding it (`reward_side`).

Decoded bytes, per request and in flight. Every image becomes float32 [H, W, 3] on the server:
12 MiB at 1024x1024. `DEFAULT_DECODED_MB` = 128 MiB holds 10 such images (a batch a model reward
scores in one pass), or the 512-image cap of tiny-world images; a remote: client splits its batch
into requests that fit the limits the server states in /health. The same number bounds the decoded
pixels of all requests in flight together (`InFlight`): a request waits until those before it are
scored, so several large requests at once cost what one does, not one each. Counted from the image
headers, before anything is decoded; each image is decoded into its place in the request's one
tensor (wire.Pending), so what the server holds is this limit, plus one image being decoded per
request, plus what the rewards allocate while scoring.

JSON. A body is read with a bound on its tokens and depth before anything is built from it
(bounded_json.py): `JSON_ITEMS_PER_IMAGE` per image of `max_images` (an image object with its
shape and a prompt take under 20) plus `JSON_SLACK_ITEMS`; `MAX_JSON_DEPTH` levels (a clip's frame
sits at 6). 57 MiB of `{},` is then refused after 17,000 tokens, where json.loads would build 19
million dicts.

Body size. The largest legitimate body holds `max_decoded` bytes of float32 pixels (the widest
encoding: raw float32 is exactly the decoded size), base64 on the wire (x 4/3), plus each image's
prompt and field names (`PROMPT_BYTES` each) and `SLACK_BYTES` for the rest of the JSON:
128 MiB x 4/3 + 512 x 2 KiB + 64 KiB = 171.7 MiB. A declared Content-Length above it is refused
with 413 before a byte of the body is read.

Connections. Each open connection holds a file descriptor; the server accepts at most
`max_connections` at once (default: half the process's descriptor limit, at most 512), so it never
runs out of descriptors; past the cap the connection that has waited longest for its headers is
closed to make room. The listen backlog is a quarter of the descriptor limit (at most 128): asyncio
accepts up to a backlog's worth of connections at once before any is seen, so cap + backlog stays
under the limit (at 1,024 descriptors: 512 + 128, the rest for the process's own files). Headers must arrive within
`header_timeout_s` of the connection (or of the
first byte of the next request on a kept-alive connection); a body within `header_timeout_s` plus
its length at `MIN_BODY_RATE`. A client that trickles its request is closed at that deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import resource
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable

DEFAULT_MAX_SIDE = 2048  # twice the largest resolution a shipped model preset generates (1024)
SIDE_FACTOR = 4  # a reward that resizes to S pixels accepts images up to SIDE_FACTOR x S per side
DEFAULT_DECODED_MB = 128.0
PROMPT_BYTES = 2048  # JSON room per image for its prompt, its format and shape fields
SLACK_BYTES = 64 * 1024
MIN_BODY_RATE = 1 << 20  # bytes/s a body must arrive at, on average (1 MiB/s)
MAX_CONNECTIONS = 512
MAX_BACKLOG = 128
DEFAULT_HEADER_TIMEOUT_S = 10.0
JSON_ITEMS_PER_IMAGE = 32
JSON_SLACK_ITEMS = 1024
MAX_JSON_DEPTH = 32


@dataclass(frozen=True)
class Limits:
    """What one request and the server as a whole may take. See the module docstring for each default."""

    max_images: int
    max_side: int
    max_decoded_bytes: int
    max_request_bytes: int
    header_timeout_s: float
    max_connections: int
    backlog: int  # connections the kernel queues, and asyncio accepts in one go, before the server sees them

    @property
    def max_json_items(self) -> int:
        return JSON_ITEMS_PER_IMAGE * self.max_images + JSON_SLACK_ITEMS

    def describe(self) -> dict[str, Any]:
        """The limits a client needs, as /health states them."""
        return {"max_images": self.max_images, "max_side": self.max_side, "max_pixels": self.max_side ** 2,
                "max_decoded_bytes": self.max_decoded_bytes, "max_request_bytes": self.max_request_bytes,
                "max_json_items": self.max_json_items, "max_json_depth": MAX_JSON_DEPTH,
                "header_timeout_s": self.header_timeout_s, "max_connections": self.max_connections}

    def body_deadline_s(self, length: int) -> float:
        """Seconds a body of `length` bytes may take to arrive."""
        return self.header_timeout_s + length / MIN_BODY_RATE


def input_side(reward: Any) -> int:
    """The side a reward resizes its images to (0: it reads them at any size)."""
    for attr in ("image_size", "crop", "size"):
        value = getattr(reward, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def reward_side(reward: Any) -> int:
    """The largest side a reward is sent: the `max_side` it declares (the bound of its own work: a reward
    that judges every pixel, as the world rewards do, costs memory with the image's area), else
    SIDE_FACTOR x its input side or DEFAULT_MAX_SIDE, the larger."""
    declared = getattr(reward, "max_side", None)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
        return declared
    return max(DEFAULT_MAX_SIDE, SIDE_FACTOR * input_side(reward))


def request_bytes(max_decoded_bytes: int, max_images: int) -> int:
    """The largest legitimate body: the decoded limit in float32 as base64, plus prompts and JSON."""
    return math.ceil(max_decoded_bytes * 4 / 3) + max_images * PROMPT_BYTES + SLACK_BYTES


def descriptors() -> int:
    """The process's open-file limit (soft), 65,536 when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 65536 if soft == resource.RLIM_INFINITY else soft


def derive(rewards: Iterable[Any], *, max_images: int, max_side: int = 0, max_decoded_mb: float = 0.0,
           max_request_mb: float = 0.0, header_timeout_s: float = 0.0, max_connections: int = 0) -> Limits:
    """The limits for `rewards`: each setting as given, or derived when 0."""
    side = max_side or max([reward_side(r) for r in rewards], default=DEFAULT_MAX_SIDE)
    decoded = int((max_decoded_mb or DEFAULT_DECODED_MB) * 2**20)
    body = int(max_request_mb * 2**20) if max_request_mb else request_bytes(decoded, max_images)
    files = descriptors()
    return Limits(max_images=max_images, max_side=side, max_decoded_bytes=decoded, max_request_bytes=body,
                  header_timeout_s=header_timeout_s or DEFAULT_HEADER_TIMEOUT_S,
                  max_connections=max_connections or max(8, min(MAX_CONNECTIONS, files // 2)),
                  backlog=max(8, min(MAX_BACKLOG, files // 4)))


class InFlight:
    """Decoded bytes held by the requests in flight, at most `limit` together. A request that does
    not fit waits its turn, first come first served (a large one is not passed over for ever by
    small ones); one larger than `limit` alone is refused before it gets here (413)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self.waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        if self.waiting or self.held + size > self.limit:
            turn = asyncio.get_running_loop().create_future()
            self.waiting.append((size, turn))
            try:
                await turn
            except BaseException:  # the request was cancelled while it waited: what it was granted goes back
                if turn.done() and not turn.cancelled():
                    self.held -= size
                self._grant()
                raise
        else:
            self.held += size
        try:
            yield
        finally:
            self.held -= size
            self._grant()

    def _grant(self) -> None:
        while self.waiting and (self.waiting[0][1].done() or self.held + self.waiting[0][0] <= self.limit):
            size, turn = self.waiting.popleft()
            if not turn.done():  # (a cancelled waiter is skipped)
                self.held += size
                turn.set_result(None)
