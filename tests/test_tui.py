"""The TUI consumes events only: a recorded events.jsonl drives it headless (Textual's run_test pilot)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time

import pytest
import typer

from solrl_cli.tui.app import JsonlTail, QueueSource, RunState, SolrlMonitor, StopScreen
from solrl_core import events as ev
from solrl_core.errors import SolrlError
from tests.screens import iteration, screen_text, SIZE, started


def write_log(path, iterations: int = 3) -> ev.JsonlLog:
    """A recorded run: start, quantization, base eval, iterations, a warning, an EMA eval."""
    log = ev.JsonlLog(path)
    log(started(str(path.parent)))
    log(ev.QuantizationReport(summary="quantized 40 of 51 layers", path="q.json"))
    log(ev.EvalFinished(iteration=0, weights="base", prompts="tinyworld_heldout", samples=256, mean=0.5254,
                        components={},
                        extras={"tinyworld_geneval.strict_accuracy": 0.184, "tinyworld_geneval.binding": 0.8},
                        seconds=4.8))
    for i in range(1, iterations + 1):
        log(iteration(i))
    log(ev.RunWarning(message="reward tinyworld_geneval is near-constant within every prompt group"))
    log(ev.EvalFinished(iteration=3, weights="ema", prompts="tinyworld_heldout", samples=256, mean=0.6113,
                        components={},
                        extras={"tinyworld_geneval.strict_accuracy": 0.293, "tinyworld_geneval.binding": 0.85},
                        seconds=4.4,
                        delta_se={"mean": 0.0123, "tinyworld_geneval.binding": 0.021}))
    return log


def test_tail_waits_for_a_partial_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = JsonlTail(path)
    assert tail.poll() == []  # not written yet
    path.write_text('{"event": "warning", "message": "a"}\n{"event": "warn')
    got = tail.poll()
    assert [type(e) for e in got] == [ev.RunWarning] and got[0].message == "a"  # typed, decoded by events.decode
    with open(path, "a") as fh:
        fh.write('ing", "message": "b"}\nnot json\n')
    got = tail.poll()
    assert got[0].message == "b" and "line 3, which is not JSON" in got[1].message


def test_tail_skips_a_newer_kind_once_and_stops_at_a_damaged_line(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = JsonlTail(path)
    future = '{"event": "from_the_future", "time": 1.0, "x": 1}\n'
    path.write_text(future + json.dumps(iteration(1).to_dict()) + "\n" + future)
    got = tail.poll()
    assert [type(e) for e in got] == [ev.RunWarning, ev.IterationFinished]  # one warning per unknown kind
    assert "line 1 and any later 'from_the_future' events: a newer solrl" in got[0].message
    assert got[1] == dataclasses.replace(iteration(1), time=got[1].time)
    assert tail.skipped == {"from_the_future": 2}
    with open(path, "a") as fh:
        fh.write('{"event": "eval", "time": 1.0, "iteration": "two"}\n')  # a known kind whose fields do not fit
    with pytest.raises(SolrlError, match="events.jsonl line 4: event 'eval' field 'iteration' should be int"):
        tail.poll()


def test_monitor_stops_with_the_error_of_a_damaged_line(tmp_path):
    log = write_log(tmp_path / "events.jsonl")
    log.close()
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write('{"event": "checkpoint", "time": 1.0, "iteration": 3}\n')  # path and seconds missing
    app = SolrlMonitor(JsonlTail(tmp_path / "events.jsonl"))

    async def scenario() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.2)
        assert not app.is_running

    asyncio.run(scenario())
    assert app.failure is not None and "line 9: event 'checkpoint' does not fit its fields" in str(app.failure)


def test_state_reads_typed_events_and_drops_iterations_a_resume_repeats():
    state = RunState()
    for i in (1, 2, 3):
        state.apply(iteration(i))
    state.apply(started(start_iteration=2, resumed=True))
    state.apply(json.loads(json.dumps(iteration(3).to_dict())))  # a record from the log is decoded first
    assert [it.iteration for it in state.iterations] == [1, 2, 3] and state.count == 3
    assert state.rolling("train") == pytest.approx(1.5)
    assert state.config.explore.group_size == 16 and state.series("final", "components",
                                                                  "tinyworld_geneval")[-1] == 0.53
    with pytest.raises(ev.UnknownEventKind):
        state.apply({"event": "from_the_future"})


def test_stage1_speed_is_at_the_steps_and_precision_the_run_reported_after_a_calibration():
    """Stage 1's steps and precision come from the run's events: its start event's plan, then the last
    CalibrationDone (calibration changes them; the config's explore.steps is only the fixed setting)."""
    state = RunState()
    state.apply(started())
    for i in (1, 2):
        state.apply(iteration(i))
    assert "(6 steps, nvfp4-emulated)" in state.explore_speed()[0]
    state.apply(ev.CalibrationDone(iteration=3, prompts=2, seeds=16, reference="fp32@10", candidates=[],
                                   chosen="fp8-e5m2-tensor@3",
                                   steps=3, precision="fp8-e5m2-tensor", min_recall=0.0, why="cheapest", fixed_steps=6,
                                   seconds=1.0, precisions=["nvfp4-emulated", "fp8-e5m2-tensor"],
                                   fixed="nvfp4-emulated@6"))
    state.apply(iteration(3))
    lines = state.explore_speed()
    assert "(3 steps, fp8-e5m2-tensor)" in lines[0] and "(10 steps, fp32)" in lines[1]
    assert "per denoising step" in lines[2]
    state.apply(started(start_iteration=3, resumed=True))  # a new session: its own start event says where Stage 1 is
    state.apply(iteration(4))
    assert "(6 steps, nvfp4-emulated)" in state.explore_speed()[0]
    state.apply(dataclasses.replace(started(), regenerate=False))  # no Stage 2 to compare with
    state.apply(iteration(1))
    assert state.explore_speed() == []


def test_monitor_replays_follows_pauses_and_switches(tmp_path):
    log = write_log(tmp_path / "events.jsonl")
    tail = JsonlTail(tmp_path / "events.jsonl")
    tail.poll_interval = 0.05

    async def scenario() -> None:
        app = SolrlMonitor(tail)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.2)
            text = screen_text(app)
            assert "tiny_sol_rl_tinyworld_geneval" in text and "iteration 3/30" in text
            assert "reward 0.53 (draft 0.43)" in text  # latest Stage-2 and Stage-1 means
            assert "explore" in text and "2.03" in text  # iteration 3's explore seconds
            # nothing holds its lock
            assert "explore speed-up per rollout" in text and "run process: not on this machine" in text
            app.save_screenshot("main.svg", path=str(tmp_path))
            svg = (tmp_path / "main.svg").read_text()
            assert "tiny_sol_rl_tinyworld_geneval" in svg and "regenerate" in svg

            log(iteration(4))  # the run goes on: the monitor follows the file
            await pilot.pause(0.3)
            assert "iteration 4/30" in screen_text(app)

            await pilot.press("p")
            log(iteration(5))
            await pilot.pause(0.3)
            text = screen_text(app)
            assert "iteration 4/30" in text and "PAUSED" in text
            await pilot.press("p")
            await pilot.pause(0.3)
            assert "iteration 5/30" in screen_text(app)

            await pilot.press("2")
            text = screen_text(app)
            assert "reward per iteration" in text and "Stage-2 mean" in text  # the chart and its legend
            assert "Stage-2 final mean" in text and "0.55" in text and "Stage-1 draft worst" in text  # the numbers
            await pilot.press("3")
            assert "grad norm" in screen_text(app)
            await pilot.press("4")
            text = screen_text(app)
            assert "0.6113" in text and _lines(text, "strict_accuracy", 1)[0].split() == ["strict_accuracy", "0.184",
                                                                                          "0.293", "+0.109"]
            # changes with their errors
            assert _lines(text, "ema", 1)[0].split() == ["3", "ema", "0.6113", "+0.0859", "0.0123", "4.4"]
            assert _lines(text, "binding", 1)[0].split() == ["binding", "0.800", "0.850", "+0.050", "0.021"]
            await pilot.press("tab")
            assert "near-constant within every prompt group" in screen_text(app)
            await pilot.press("tab")
            assert "NVIDIA H100 80GB HBM3" in screen_text(app)
            await pilot.press("q")
        assert not app.is_running

    asyncio.run(scenario())
    log.close()


def test_train_tui_quit_asks_then_stops_safely():
    source, stopped = QueueSource(), threading.Event()
    bus = ev.EventBus()
    bus.subscribe(source)
    bus.emit(iteration(1))

    async def scenario() -> None:
        app = SolrlMonitor(source, stop=stopped.set)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.3)
            await pilot.press("q")
            assert isinstance(app.screen, StopScreen)
            await pilot.press("c")  # cancel: training goes on
            assert not stopped.is_set() and app.is_running
            await pilot.press("q", "s")
            assert stopped.is_set()
            await pilot.pause(0.3)
            assert app.is_running and "stopping: finishing iteration 2" in screen_text(app)
            bus.emit(iteration(2))  # the trainer finishes its iteration, saves, returns
            source.done.set()
            await pilot.pause(0.5)
            assert not app.is_running  # it left by itself once the trainer returned
        assert app.state.iteration == 2

    asyncio.run(scenario())


def test_run_tui_training_joins_the_trainer(monkeypatch):
    """Any way out of the app sets the stop flag and waits for the iteration and checkpoint."""
    from types import SimpleNamespace

    from solrl_cli.tui import app as tui
    from solrl_core.config.schema import Config

    saved = []

    def fake_train(bus, stop=None):
        i = 0
        while not stop.requested:
            i += 1
            bus.emit(iteration(i))
            time.sleep(0.02)
        time.sleep(0.2)  # the iteration in flight, then its checkpoint
        saved.append(i)
        return "session"

    async def headless(self) -> None:
        async with self.run_test(size=SIZE) as pilot:
            await pilot.pause(0.2)
            await pilot.press("q", "s")
            await pilot.pause(0.5)

    monkeypatch.setattr(tui.SolrlMonitor, "run", lambda self: asyncio.run(headless(self)))
    assert tui.run_tui_training(SimpleNamespace(config=Config(), train=fake_train)) == "session" and len(saved) == 1


def test_monitor_command_needs_events(tmp_path):
    from solrl_cli.monitor_cmd import monitor

    with pytest.raises(typer.Exit) as exc:
        monitor(tmp_path)
    assert exc.value.exit_code == 2


def _lines(text: str, first: str, count: int) -> list[str]:
    """`count` screen lines from the one containing `first`, right-stripped: a snapshot of a region."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    return [line.rstrip() for line in lines[start:start + count]]


def test_reward_chart_has_axes_ticks_and_legend(tmp_path):
    log = write_log(tmp_path / "events.jsonl", iterations=40)
    log.close()

    async def scenario() -> None:
        app = SolrlMonitor(JsonlTail(tmp_path / "events.jsonl"))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.2)
            await pilot.press("2")
            await pilot.pause(0.2)
            text = screen_text(app)
            chart = _lines(text, "reward per iteration", 30)
            assert chart[1].lstrip().startswith("┌") and "┐" in chart[1]  # the frame
            assert chart[2].lstrip().startswith("1.00┤ ") and "Stage-2 mean" in chart[2]  # y ticks, legend
            assert [line.split("┤")[0].strip() for line in chart if "┤" in line] == ["1.00", "0.83", "0.67", "0.50",
                                                                                     "0.33",
                                                                                       "0.17", "0.00"]
            axis = next(i for i, line in enumerate(chart) if "└" in line)
            assert chart[axis + 1].split() == ["5", "10", "15", "20", "25", "30", "35", "40"]  # whole iterations
            assert "iteration" in chart[axis + 2]
            assert any("⠉" in line or "⣀" in line for line in chart[2:axis])  # braille curves
            await pilot.press("4")
            await pilot.pause(0.1)
            assert "held-out evaluation" in screen_text(app)

    asyncio.run(scenario())


def test_environment_panel_shows_the_machine_the_run_started_on(tmp_path):
    log = write_log(tmp_path / "events.jsonl")
    log(iteration(4))
    log.close()
    with open(tmp_path / "events.jsonl", "a") as fh:  # a peak the run measured (a field newer events carry)
        fh.write('{"event": "iteration", "time": 1.0, "iteration": 5, "iterations": 30, "seconds": {"total": 1.0}, '
                 '"final": {"mean": 0.5, "std": 0, "best": 1, "worst": 0, "components": {}}, "draft": null, '
                 '"loss": {"loss": 1, "policy": 1, "kl": 0}, "nonfinite_losses": 0, "grad_norm": 0.1, "old_decay": 0, '
                 '"peak_memory": {"explore": 12.5, "train": 18.25}}\n')

    async def scenario() -> None:
        app = SolrlMonitor(JsonlTail(tmp_path / "events.jsonl"))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.2)
            await pilot.press("6")
            await pilot.pause(0.1)
            text = screen_text(app)
            assert _lines(text, "machine the run started on", 2) == [
                " machine the run started on  device cuda:0, Python 3.12.3, Linux-6.8-x86_64",
                " explore precision: auto chose nvfp4-emulated; full precision bf16; solrl runs fp8, nvfp4-emulated, "
                "bf16, fp32"]
            gpu = _lines(text, "NVIDIA H100", 1)[0].split()
            assert gpu == ["run", "cuda:0", "NVIDIA", "H100", "80GB", "HBM3", "9.0", "79", "GiB", "fp8,",
                           "nvfp4-emulated,",
                           "bf16,", "fp32"]
            assert "not installed: pip install transformer-engine[pytorch]" in _lines(text, "Transformer Engine", 1)[0]
            assert _lines(text, "torchao", 1)[0].split()[1:] == ["0.13.0;", "FP8", "(sm", ">=", "8.9):", "yes;",
                                                                 "NVFP4/MX",
                                                                   "(sm", ">=", "10.0):", "no"]
            assert "estimate 21.4 GiB (approximate, as solrl doctor) against measured peak 18.25 GiB" in text
            assert "GPU " not in _lines(text, "", 3)[2]  # the header shows the replaying machine, which has none

    asyncio.run(scenario())


def test_charts_thin_long_histories_to_the_screen():
    from solrl_cli.tui.state import thin

    xs = [float(i) for i in range(1, 5001)]
    tx, ty = thin(xs, [2 * x for x in xs], 300)
    assert len(tx) == 300 and tx[0] == pytest.approx(9.0) and ty[-1] == pytest.approx(2 * 4992.0)
    assert thin(xs[:10], xs[:10], 300) == (xs[:10], xs[:10])
