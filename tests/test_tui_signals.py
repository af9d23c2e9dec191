"""`solrl train --tui` stops on a signal as plain mode does (solrl_core/runtime/stopping.py's
graceful_stop, the one mechanism): real signals to this process while the headless app runs and a
stand-in trainer (a worker thread, as in a real run) waits for the stop."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from solrl_cli.tui import app as tui
from solrl_core.config.schema import Config
from solrl_core.runtime import distributed
from tests.screens import iteration, SIZE


def _trainer(flags: list, done=lambda stop: stop.requested) -> SimpleNamespace:  # type: ignore[no-untyped-def,type-arg]
    """A run that emits iterations until `done(stop)` (at most 30 s), then saves; records the flag it was given."""
    def train(bus, stop=None):  # type: ignore[no-untyped-def]
        flags.append(stop)
        for i in range(1, 1500):
            if done(stop):
                break
            bus.emit(iteration(i))
            time.sleep(0.02)
        time.sleep(0.1)  # the iteration in flight, then its checkpoint
        return "session"
    return SimpleNamespace(config=Config(), train=train)


def _headless(monkeypatch, scenario) -> list:  # type: ignore[no-untyped-def,type-arg]
    """Run the app headless through `scenario(app, pilot)`, then wait, without a key, for it to close
    (within 30 s on any machine); the list returned says whether it closed by itself."""
    closed = []

    async def run(self) -> None:
        async with self.run_test(size=SIZE) as pilot:
            await pilot.pause(0.2)
            await scenario(self, pilot)
            for _ in range(300):
                if not self.is_running:
                    break
                await pilot.pause(0.1)
            closed.append(not self.is_running)

    monkeypatch.setattr(tui.SolrlMonitor, "run", lambda self: asyncio.run(run(self)))
    return closed


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_sigterm_after_q_asks_again_at_the_phase_boundary_and_closes_the_view(monkeypatch):
    """q then s asks for a stop after the iteration; a SIGTERM while the view is still open is not
    'a second request means now' (a KeyboardInterrupt would leave the terminal in raw mode): it
    asks again, at the next phase boundary, and the view closes by itself."""
    flags: list = []

    async def scenario(app, pilot):  # type: ignore[no-untyped-def]
        await pilot.press("q", "s")
        assert flags[0].requested and flags[0].source == "q" and not flags[0].at_phase
        os.kill(os.getpid(), signal.SIGTERM)
        await pilot.pause(0.2)

    closed = _headless(monkeypatch, scenario)
    # the trainer goes on until the phase-boundary request: the view is still open when the signal comes
    assert tui.run_tui_training(_trainer(flags, done=lambda stop: stop.at_phase)) == "session"  # no KeyboardInterrupt
    assert flags[0].source == "SIGTERM" and flags[0].at_phase  # run.stop_on_sigterm = phase, the default
    assert closed == [True]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_the_launcher_gone_stops_a_tui_run_as_it_stops_a_plain_one(monkeypatch):
    """Under a launcher (--nproc-per-node), its death sends LAUNCHER_GONE: the TUI's run stops as a
    plain one does, with a checkpoint, instead of ignoring it."""
    seen = []
    # never the default: it kills
    previous = signal.signal(distributed.LAUNCHER_GONE, lambda signum, frame: seen.append(signum))
    # a launcher that is not our parent: gone
    monkeypatch.setenv(distributed.WATCHED_ENV, str(os.getppid() + 1_000_000))
    flags: list = []

    async def scenario(app, pilot):  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), distributed.LAUNCHER_GONE)
        await pilot.pause(0.2)

    try:
        closed = _headless(monkeypatch, scenario)
        assert tui.run_tui_training(_trainer(flags)) == "session"
    finally:
        signal.signal(distributed.LAUNCHER_GONE, previous)
    assert seen == []  # graceful_stop's handler took it while the run was on
    assert flags[0].requested and flags[0].source == "the launcher died" and flags[0].at_phase
    assert closed == [True]  # the view closed by itself: the run is stopping
