"""CPU lanes: a rollout's independent batches run side by side, one torch thread each.

On a CPU torch splits every op over its OpenMP threads, and every op ends at a barrier. With idle
threads asleep (OMP_WAIT_POLICY=PASSIVE, threads.py, kept because spinning threads cost 20x on a
shared machine) each barrier wakes a sleeping thread, which is most of the cost of the small ops a
CPU-sized model is made of. Batches that do not depend on each other (a prompt group's seeds in
Stage 1, an evaluation's batches) need no barrier between them: `map_in_lanes` runs them on
`lanes` Python threads, torch single-threaded in each (torch releases the GIL inside its ops), so
each core works through whole batches on its own. A batch's numbers are its own either way: torch's
CPU kernels split their work by output rows, so the thread count changes no value (tests/test_lanes.py
holds the tiny models to that, bit for bit).

Grad mode, CPU autocast and torch.compile's cache tag are per thread in torch; each lane takes the
caller's. Anything else a caller set per thread is not carried: a caller that needs more runs with
one lane (a compiled network, a compiled or sharded update: Engine.lanes_for, update._lanes).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


def map_in_lanes(fn: Callable[[T], R], items: Iterable[T], lanes: int) -> list[R]:
    """[fn(item) for item in items], in order, on up to `lanes` threads with one torch thread each
    (torch's thread count is restored after); a single item too, so an item's values never depend on
    how many came with it. One lane: in this thread, as given. The first error is raised once every
    started item has ended; items not yet started are dropped."""
    work = list(items)
    if lanes <= 1 or not work:
        return [fn(item) for item in work]
    grad, autocast, cast_dtype = (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"),
                                  torch.get_autocast_dtype("cpu"))
    tag = torch.compiler.config.cache_key_tag  # the run's compile cache tag (engine/attention.py), also per thread

    def lane(item: T) -> R:
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=cast_dtype, enabled=autocast), \
                torch.compiler.config.patch(cache_key_tag=tag):
            return fn(item)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # read by each new thread when it first runs an op: the lanes start below
    pool = ThreadPoolExecutor(min(lanes, len(work)), thread_name_prefix="solrl-lane")
    try:
        futures: list[Future[R]] = [pool.submit(lane, item) for item in work]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)
