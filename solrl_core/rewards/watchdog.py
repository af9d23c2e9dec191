"""The reward watchdog: one reward's scoring call with a time limit and a retry.

A reward model can hang (a stuck CUDA kernel, a reward server that never answers, a deadlock in
its backend) or raise (a transient I/O error, a bad batch). Without a limit a hang holds the whole
run forever, and a signal cannot stop it: the loop only looks at its stop flag between iterations.
So each scoring call runs in a daemon thread and the caller waits at most `timeout_s` for it; past
that, `RewardFailure` stops the run (the trainer saves the last finished iteration first). The
hung thread is left behind: Python cannot stop a thread, and a daemon one does not keep the
process alive.

A stop request (Ctrl-C, SIGTERM, SIGHUP, the TUI's q: `stop`) gives the call in progress
`STOP_GRACE_S` to finish, then abandons it with `ScoringAbandoned`, whatever `timeout_s` says (even 0):
every reward is scored before the iteration's update, so the loop drops the iteration as a stop at a
phase boundary does and saves the last finished one. The worker thread runs whenever a stop can be
asked, so the main thread, which receives the signals, is never stuck inside a reward.

An ordinary exception is retried `retries` times, then becomes `RewardFailure`. A CUDA
out-of-memory error is not this module's business: it passes through unchanged to the back-off that
halves reward.batch_size (faults/oom.py), as do KeyboardInterrupt and SystemExit.

The worker thread runs with the caller's grad mode and autocast state (both are per-thread in
torch) and its current CUDA device, so a watched call computes exactly what a direct one would.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator, TypeVar

import torch

from solrl_core.errors import SolrlError
from solrl_core.runtime.stopping import ScoringAbandoned

T = TypeVar("T")
STOP_GRACE_S = 3.0  # after a stop request, how long a scoring call may still take before it is abandoned
_SLICE_S = 0.1  # how often the waiting thread looks at the stop request
_FIX = ("raise reward.timeout_s, or 0 to turn the watchdog off, and continue from the checkpoint saved: "
        "`solrl train --resume RUN --set reward.timeout_s=SECONDS`")


class RewardFailure(SolrlError):
    """A reward hung past its time limit, or kept raising. `reward` names it."""

    def __init__(self, reward: str, message: str, fix: str) -> None:
        super().__init__(message, fix)
        self.reward = reward


def call_watched(name: str, score: Callable[[], T], timeout_s: float, retries: int,
                 on_retry: Callable[[str], None] | None = None, stop: Callable[[], bool] | None = None) -> T:
    """`score()` under the watchdog: at most `timeout_s` seconds (0: no limit), and `retries` more
    tries after an exception. `on_retry(message)` hears of each retry. `stop()`, true once a stop was
    asked, abandons the call `STOP_GRACE_S` later (ScoringAbandoned). With neither a limit nor `stop`
    the call runs in the caller's thread."""
    for attempt in range(retries + 1):
        try:
            return _within(name, score, timeout_s, stop)
        except (torch.cuda.OutOfMemoryError, RewardFailure, ScoringAbandoned):
            raise
        except Exception as exc:  # noqa: BLE001 - any error of a reward's own code is retried, then named
            if attempt == retries:
                own = isinstance(exc, SolrlError) and exc.fix  # its message and its fix, each said once
                fix = exc.fix if own else ("fix the reward (SOLRL_DEBUG=1 shows the traceback), then continue from the "
                                           "checkpoint saved: `solrl train --resume RUN`")
                tries = f" ({retries + 1} tries)" if retries else ""
                # ours say what they are
                what = exc.message if isinstance(exc, SolrlError) else f"{type(exc).__name__}: {exc}"
                raise RewardFailure(name, f"reward '{name}' failed{tries}: {what}", fix) from exc
            if on_retry is not None:
                on_retry(f"reward '{name}' raised {type(exc).__name__}: {exc}; trying again ({attempt + 1} of "
                         f"{retries})")
    raise AssertionError("unreachable")


def _within(name: str, score: Callable[[], T], timeout_s: float, stop: Callable[[], bool] | None) -> T:
    if not timeout_s and stop is None:
        return score()
    outcome: dict[str, object] = {}
    done = threading.Event()
    enter = _callers_state()

    def work() -> None:
        try:
            with enter():
                outcome["value"] = score()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name=f"solrl-reward-{name}", daemon=True).start()
    _wait(name, done, timeout_s, stop)
    error = outcome.pop("error", None)
    if error is not None:
        raise error  # type: ignore[misc]
    return outcome.pop("value")  # type: ignore[return-value]


def _wait(name: str, done: threading.Event, timeout_s: float, stop: Callable[[], bool] | None) -> None:
    """Until `done`, in short slices: RewardFailure past `timeout_s` (0: never), ScoringAbandoned
    `STOP_GRACE_S` after `stop()` first says yes."""
    start = time.monotonic()
    asked: float | None = None
    while True:
        now = time.monotonic()
        limits = [start + timeout_s] if timeout_s else []
        if stop is not None:
            if asked is None and stop():
                asked = now
            limits.append(asked + STOP_GRACE_S if asked is not None else now + _SLICE_S)
        if done.wait(max(0.0, min(limits) - now)):
            return
        now = time.monotonic()
        if timeout_s and now >= start + timeout_s:
            raise RewardFailure(name, f"reward '{name}' did not finish scoring a batch within "
                                      f"reward.timeout_s={timeout_s:g} s", _FIX)
        if asked is not None and now >= asked + STOP_GRACE_S:
            raise ScoringAbandoned(f"reward '{name}' was still scoring {STOP_GRACE_S:g} s after the stop request "
                                   "(its call is left running in its thread)")


def _callers_state() -> Callable[[], contextlib.AbstractContextManager]:
    """A context that gives another thread this thread's grad mode, autocast and CUDA device."""
    grad = torch.is_grad_enabled()
    casts = [(d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    @contextlib.contextmanager
    def enter() -> Iterator[None]:
        if device is not None:
            torch.cuda.set_device(device)
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.set_grad_enabled(grad))
            for device_type, dtype in casts:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            yield
    return enter
