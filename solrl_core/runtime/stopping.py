"""How a run stops when asked: by Ctrl-C, SIGTERM, SIGHUP (the terminal closed) or the TUI's q.

    first SIGINT / SIGHUP / q     finish the iteration in progress, save a checkpoint, stop
    first SIGTERM                 `run.stop_on_sigterm`: "phase" (default) stops at the next phase
                                  boundary: an iteration whose update has not run yet is abandoned
                                  (it is redone exactly on resume: its draws derive from the seed and
                                  its number) and the last finished iteration is saved; "iteration"
                                  finishes it, as Ctrl-C does
    any second signal             stop now (KeyboardInterrupt); checkpoints are written atomically,
                                  so the last one on disk stays intact
    the launcher killed           (several processes) each process gets the parent-death signal
                                  (distributed.watch_launcher) and stops as a first SIGTERM does; its
                                  repeats are not a second request

An evaluation is not an iteration: any first request drops the one in progress between two of its
rollout batches (GenerationStopped; trainer and `solrl eval`), and a training run saves with its
checkpoint that the evaluation is still due, so a resume does it first (loop_state.LoopState).

A reward that does not answer does not hold a stop: its call is abandoned a few seconds after the
request (rewards/watchdog.py, one process; with several, the other ranks would wait for it in a
collective).

Every request is acknowledged at once with a `StopRequested` event naming what the run waits for;
a closed terminal's output goes to /dev/null so the run can save in peace. With several processes
a request seen on any rank stops every rank at the same place (a tiny all-reduce at each boundary).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable, Iterator

from solrl_core.runtime import distributed

SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
if hasattr(signal, "SIGHUP"):
    SIGNAL_NAMES[signal.SIGHUP] = "SIGHUP"
LAUNCHER_SOURCE = "the launcher died"
ABANDONABLE = ("explore", "selection", "regenerate", "train")  # entered before the update: the weights are untouched


class StopAtBoundary(Exception):
    """Raised where a phase begins, once a stop at the next phase boundary was asked: the iteration in
    progress is abandoned before its update, and the loop saves the last finished one."""


class ScoringAbandoned(StopAtBoundary):
    """A reward's scoring call still running `STOP_GRACE_S` after a stop request (rewards/watchdog.py).
    Every reward scores before the update, so the iteration is abandoned as at a phase boundary (an
    evaluation, which scores after the EMA is swapped back, is dropped: run_eval.py); `message` says which."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class GenerationStopped(StopAtBoundary):
    """A stop request seen between the rollout batches of an evaluation (engine.Engine.generate): the
    images not yet generated are dropped, with those made so far."""

    def __init__(self, done: int, total: int) -> None:
        self.message = f"a stop was requested with {done} of {total} images generated"
        super().__init__(self.message)


class StopFlag:
    """What a stop request asked for, and where the loop is (for the acknowledgement).

    `requested` alone (set by tests or a caller) means: stop after this iteration."""

    def __init__(self) -> None:
        self.requested = False
        self.at_phase = False  # stop at the next phase boundary, abandoning an iteration not yet updated
        self.source = ""  # what asked: Ctrl-C, SIGTERM, SIGHUP, q
        self.phase = ""  # the phase last begun ("" before the first iteration)
        self.iteration = 0  # the iteration the loop last began (1-based)
        self.announce: Callable[["StopFlag"], None] | None = None  # set by the trainer: emit StopRequested

    def request(self, source: str, at_phase: bool = False) -> None:
        """Ask the run to stop (after the iteration, or at the next phase boundary with `at_phase`)."""
        self.requested = True
        self.at_phase = self.at_phase or at_phase
        self.source = source
        if self.announce is not None:
            self.announce(self)

    def entering(self, phase: str) -> None:
        """Called as each phase of an iteration begins (phases.PhaseRecorder). Raises StopAtBoundary
        when a phase-boundary stop was asked on any rank and the update has not run yet."""
        self.phase = phase
        if phase in ABANDONABLE and distributed.any_true(self.requested and self.at_phase):
            raise StopAtBoundary(phase)


def detach_from_terminal() -> None:
    """The terminal is gone (SIGHUP): send stdout and stderr to /dev/null, so the next write does not
    fail with EIO while the run finishes and saves."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(null, fd)
    os.close(null)


@contextlib.contextmanager
def graceful_stop(flag: StopFlag, sigterm: str = "phase", *, on_request: Callable[[int], None] | None = None,
                  may_interrupt: Callable[[], bool] = lambda: True) -> Iterator[StopFlag]:
    """Install the handlers above in the main thread (elsewhere, whoever owns the signals calls
    `flag.request`). `sigterm`: run.stop_on_sigterm. The TUI, which trains in a worker thread, adds
    two things: `on_request(signum)` runs after each request a signal makes (it closes the view), and
    while `may_interrupt()` is false a repeated signal asks again instead of stopping now (a
    KeyboardInterrupt raised while the view holds the terminal would leave it in raw mode)."""
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def ask(signum: int, source: str, at_phase: bool) -> None:
        flag.request(source, at_phase=at_phase)
        if on_request is not None:
            on_request(signum)

    def handler(signum: int, frame: object) -> None:
        if signum == distributed.LAUNCHER_GONE:  # repeated as each thread of the launcher exits: not a second request
            if distributed.orphaned() and not flag.requested:
                ask(signum, LAUNCHER_SOURCE, sigterm == "phase")
            return
        if flag.requested and may_interrupt():  # a second request means now; checkpoints are atomic, so nothing is torn
            raise KeyboardInterrupt
        if signum == getattr(signal, "SIGHUP", None):
            detach_from_terminal()
        ask(signum, SIGNAL_NAMES[signum], signum == signal.SIGTERM and sigterm == "phase")

    previous = {s: signal.signal(s, handler) for s in (*SIGNAL_NAMES, distributed.LAUNCHER_GONE)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
