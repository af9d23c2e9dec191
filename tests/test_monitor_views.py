"""What a run looks like from outside it (issue 51: 3, 4, 10): `solrl monitor` piped or without a
terminal prints a plain snapshot and exits; the TUI at 80x24 reads whole, describes a finished run as
finished, shows an evaluation's progress and the plan's speed-up, logs iterations and evaluations, and
leaves its warnings on the terminal after quitting; only rank 0 of a torchrun run starts the UI; the end
summary's "last N iterations" never counts the first; a video model's clips are called clips, and GIFs
say once that MP4 needs the video extra. One tiny finished run (2 iterations, a 4-image evaluation)
feeds the module."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from solrl_cli.tui.app import SolrlMonitor, outcome
from solrl_cli.tui.panels import log_view
from solrl_cli.tui.state import JsonlTail, RunState
from solrl_core import events as ev
from tests.screens import SMALL, started, text_of

ROOT = Path(__file__).resolve().parents[1]
WARNING = "reward tinyworld_geneval is near-constant within every prompt group"

pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny sol_rl run trained to its end in this process: its folder and the events it emitted."""
    from solrl_core.config.presets import resolve_config
    from solrl_core.loop.trainer import train
    from tests.conftest import FAST

    run_dir = tmp_path_factory.mktemp("views") / "run"
    cfg = resolve_config("tiny", "sol_rl", sets=[*FAST, f"run.run_dir={run_dir}", "run.iterations=2", "run.threads=1"])
    seen: list[ev.Event] = []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    train(cfg, bus)
    return run_dir, seen


@pytest.fixture
def warned_run(finished_run, tmp_path):
    """A copy of the finished run whose log also holds a warning (before its end, as a run emits one)."""
    run = tmp_path / "run"
    shutil.copytree(finished_run[0], run, ignore=shutil.ignore_patterns("checkpoints", "*.lock"))
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    (run / "events.jsonl").write_text("".join(lines[:-1]))
    log = ev.JsonlLog(run / "events.jsonl")
    log(ev.RunWarning(message=WARNING))
    log.close()
    with open(run / "events.jsonl", "a") as fh:
        fh.write(lines[-1])
    return run


def _pilot(path: Path, keys: tuple[str, ...] = ()) -> dict[str, str]:
    """The 80x24 screen of `solrl monitor` on `path`, first as it opens, then after each key."""
    app = SolrlMonitor(JsonlTail(path))
    seen: dict[str, str] = {}

    events = len(path.read_text().splitlines())

    async def scenario() -> None:
        async with app.run_test(size=SMALL) as pilot:
            for _ in range(600):  # until the app has read every event: seconds on a loaded machine
                await pilot.pause(0.05)
                if app.state.version >= events:
                    break
            await pilot.pause(0.3)  # and drawn them
            seen[""] = text_of(app)
            for key in keys:
                await pilot.press(key)
                await pilot.pause(0.2)
                seen[key] = text_of(app)
    asyncio.run(scenario())
    return seen


# ---------------------------------------------------------------- 3: monitor without a terminal


def test_monitor_piped_prints_a_plain_snapshot_and_exits(warned_run):
    """`solrl monitor RUN </dev/null | cat`: no full-screen UI in the pipe, the panels' numbers as text, exit 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"{sys.executable} -m solrl_cli monitor {warned_run} </dev/null | cat; exit ${{PIPESTATUS[0]}}"
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)  # about 2 s; a full-screen app in the pipe never returns
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the monitor too, not only bash
        proc.communicate()
        pytest.fail("`solrl monitor RUN </dev/null | cat` did not exit within 120 s")
    assert proc.returncode == 0, out + err
    assert "\x1b" not in out and "snapshot" in out
    assert "iteration 2/2" in out and "run completed" in out and "(2/2 iterations" in out  # progress, finished and when
    assert "not on this machine" not in out
    for section in ("== time ==", "== rewards ==", "== eval ==", "== warnings & log ==", "== end =="):
        assert section in out
    assert "explore speed-up per rollout" in out and "Stage-2 final mean" in out
    rows = [line.split() for line in out.splitlines()]
    assert any(r[:2] == ["0", "base"] for r in rows) and any(r[:2] == ["2", "ema"] for r in rows)  # each evaluation
    assert "1 warning" in out and WARNING in out
    assert "done: 2 iterations in" in out and "mean Stage-2 reward: first iteration" in out  # the end summary


def test_a_finished_run_is_described_as_finished_with_when(finished_run):
    run_dir, seen = finished_run
    end = next(e for e in seen if isinstance(e, ev.RunFinished))
    header = "\n".join(_pilot(run_dir / "events.jsonl")[""].splitlines()[:3])
    assert f"run completed {time.strftime('%H:%M:%S', time.localtime(end.time))} (2/2 iterations" in header
    assert "not on this machine" not in header


# ---------------------------------------------------------------- 4: the TUI


def test_80x24_reads_whole_header_footer_and_the_time_chart(finished_run):
    screen = _pilot(finished_run[0] / "events.jsonl")[""].splitlines()
    assert len(screen) == SMALL[1]
    assert "…" not in screen[0] and "key 6: plan" in screen[0]  # the header's first line whole
    assert "…" not in screen[-1] and screen[-1].split() == ["tab", "next", "panel", "q", "quit", "?", "help", "p",
                                                            # the footer whole: the tab row names panels
                                                            "pause/resume"]
    assert "1 time" in screen[3] and "6 environment" in screen[3]
    chart = [i for i, line in enumerate(screen) if "┤" in line]
    assert chart and any("iteration" in line for line in screen[chart[-1]:])  # the whole chart, down to its x label


def test_an_evaluation_running_shows_its_progress_and_the_plan_its_speed_up(tmp_path):
    log = ev.JsonlLog(tmp_path / "events.jsonl")
    log(started(str(tmp_path)))
    log(ev.EvalStarted(iteration=0, weights="base", prompts="tinyworld_heldout", samples=256))
    log(ev.EvalProgress(iteration=0, weights="base", done=96, total=256))
    log.close()
    seen = _pilot(tmp_path / "events.jsonl", ("4",))
    assert "evaluating base: 96/256 images" in seen["4"].splitlines()[1]  # the header's progress row
    assert "evaluating the base weights on tinyworld_heldout: 96/256 images" in seen["4"]
    assert "no evaluation yet" not in seen["4"]
    assert "not derivable" not in seen[""] and "explore speed-up: after the first iteration" in seen[""]


def test_the_log_shows_iterations_and_evaluations(finished_run, warned_run):
    state = RunState()
    for e in finished_run[1]:
        state.apply(e)
    text = log_view(state).plain
    assert "iteration 1/2: reward" in text and "iteration 2/2: reward" in text
    assert ("evaluated the base weights on" in text and "evaluated the ema weights on" in text
            and "since the base" in text)
    # panel 5 at 80x24 opens on its newest lines (the log is longer than the screen) and the warnings under them
    screen = _pilot(warned_run / "events.jsonl", ("5",))["5"]
    assert "iteration 2/2: reward" in screen and "run completed at iteration 2" in screen
    assert "warnings: 1" in screen and WARNING[:30] in screen


def test_the_summary_after_quitting_lists_the_warnings_panel_5_showed(finished_run):
    state = RunState()
    for e in finished_run[1][:-1]:
        state.apply(e)
    state.apply(ev.RunWarning(message=WARNING))
    state.apply(finished_run[1][-1])
    said = outcome(state)
    assert "1 warning:" in said and WARNING in said


def test_only_rank_0_of_a_torchrun_run_starts_the_ui(monkeypatch):
    """Every torchrun process inherits the terminal: the others train with the plain (silent) display."""
    import pty

    from solrl_cli import train_cmd
    from solrl_cli.tui import app as tui

    main, other = pty.openpty()
    with os.fdopen(other, "w") as screen, os.fdopen(os.dup(other), "r") as keys:
        monkeypatch.setattr(sys, "stdin", keys)
        monkeypatch.setattr(sys, "stdout", screen)
        uis: list[object] = []
        monkeypatch.setattr(tui, "run_tui_training", lambda start: uis.append(start) or "ui")
        start = SimpleNamespace(train=lambda bus: "plain")
        monkeypatch.setenv("RANK", "1")
        assert train_cmd._run(start, tui=True) == "plain" and not uis
        monkeypatch.setenv("RANK", "0")
        assert train_cmd._run(start, tui=True) == "ui"  # rank 0, on a terminal: the UI
    os.close(main)


# ---------------------------------------------------------------- 10: the end summary, video clips


def test_the_last_iterations_never_include_the_first(finished_run):
    from solrl_view.run_summary import end_summary

    seen = finished_run[1]
    rewards = [e.final.mean for e in seen if isinstance(e, ev.IterationFinished)]
    end = next(e for e in seen if isinstance(e, ev.RunFinished))
    assert end.last_iterations == 1 and end.last3_reward == pytest.approx(rewards[1])
    assert f"first iteration {rewards[0]:.4g}, last 1 iteration {rewards[1]:.4g}" in end_summary(end)[0]


def test_infer_on_tiny_video_says_clips_and_once_that_mp4_needs_the_video_extra(tmp_path, monkeypatch):
    from PIL import Image
    from typer.testing import CliRunner

    from solrl_cli.app import app
    from solrl_view.display import TerminalDisplay
    from solrl_core.io import video_output

    monkeypatch.setattr(video_output, "mp4_available", lambda: False)  # a machine without imageio
    result = CliRunner().invoke(app, ["infer", "--model", "tiny_video", "--prompt", "a red circle growing", "--seeds",
                                      "2",
                                      "--steps", "2", "--out", str(tmp_path / "clips"), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "2 clips (GIF" in result.output and "2 images" not in result.output and "clips: " in result.output
    assert result.output.count("MP4 needs the video extra") == 1 and 'pip install "solrl[video]"' in result.output
    with Image.open(tmp_path / "clips" / "base" / "000_seed0.gif") as gif:
        assert gif.n_frames == 4 and gif.info["duration"] == 250  # one pass a second, not a quarter-second flicker

    console = Console(file=io.StringIO(), width=300)
    display = TerminalDisplay(console)
    for weights in ("base", "ema"):  # infer on a run: two weight sets, the hint once
        display(ev.ImagesWritten(weights=weights, count=2, seconds=1.0, folder=weights, clips="gif"))
    assert console.file.getvalue().count('MP4 needs the video extra (pip install "solrl[video]"') == 1


def test_explore_on_tiny_video_and_a_runs_gif_sample_grid_say_once_that_mp4_needs_the_video_extra(tmp_path,
                                                                                                  monkeypatch):
    from typer.testing import CliRunner

    from solrl_cli.app import app
    from solrl_view.display import TerminalDisplay
    from solrl_core.io import video_output

    monkeypatch.setattr(video_output, "mp4_available", lambda: False)  # a machine without imageio
    result = CliRunner().invoke(app, ["explore", "--model", "tiny_video", "--prompt", "a red circle growing", "--n",
                                      "2",
                                      "--k", "2", "--steps", "2", "--out", str(tmp_path / "explore"), "--device",
                                      "cpu"])
    assert result.exit_code == 0, result.output
    assert any((tmp_path / "explore" / "clips").glob("*.gif"))
    assert result.output.count('MP4 needs the video extra (pip install "solrl[video]"') == 1

    console = Console(file=io.StringIO(), width=300)
    display = TerminalDisplay(console)
    for iteration in (10, 20):  # run.image_every=10: the hint once, with the clip it is about
        display(ev.SampleGrid(iteration=iteration, prompt="a red circle growing", rewards=[1.0],
                              path=f"iter_{iteration}.png",
                              seconds=0.1, seeds=[0], video=f"samples/iter_{iteration:06d}.gif"))
    out = console.file.getvalue()
    assert out.count("MP4 needs the video extra") == 1 and "samples/iter_000010.gif" in out
