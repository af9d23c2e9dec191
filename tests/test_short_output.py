"""80 columns and short by default: the live bar keeps its count, elapsed time and ETA whole; an iteration
is one line of 80 columns (its phases, memory and MFU with --verbose or in events.jsonl); the start header
at most 10 lines; `doctor` at most 40 lines; `config-help` a summary; explore a few prompts' selection."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from solrl_view.display import TerminalDisplay
from solrl_core import events as ev

ROOT = Path(__file__).resolve().parents[1]
MACHINE = ("explore nvfp4-emulated (auto on a CPU: the exact NVFP4 emulation (no real low-precision kernel runs "
           "here)); rollout copy on (no GPU memory limit to respect); gradient checkpointing off (off on a CPU); "
           "update eager; memory mode none (auto: off on a CPU); torch threads 2 (auto: one per core this process may "
           "use, 2); OMP_WAIT_POLICY=PASSIVE")


def _console(terminal: bool = False) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=80, force_terminal=terminal, color_system=None, highlight=False, markup=False), out


def _started() -> ev.RunStarted:
    return ev.RunStarted(run_dir="runs/20261129-074800-tiny_sol_rl_tinyworld_geneval",
                         preset="tiny_sol_rl_tinyworld_geneval",
                         device="cpu", dtype="fp32", explore_precision="nvfp4-emulated",
                         plan="Stage 1: 16 seeds/prompt at nvfp4-emulated, 6 steps -> keep 8 -> Stage 2: regenerate "
                              "the kept 8 at fp32 on the rollout copy, 10 steps -> "
                              "train", start_iteration=0, iterations=30,
                         resumed=False, config={}, machine=MACHINE, rewards=["tinyworld_geneval (weight 1)"])


def _iteration() -> ev.IterationFinished:
    stats = ev.RewardStats(mean=0.8047, std=0.1, best=1.0, worst=0.25, components={})
    return ev.IterationFinished(iteration=1, iterations=30, draft=ev.RewardStats(0.748, 0.1, 1.0, 0.25, {}),
                                final=stats,
                                seconds={"explore": 1.95, "regenerate": 0.96, "reward": 0.26, "train": 2.37,
                                         "sync": 0.08,
                                         "total": 5.63},
                                loss={"loss": 1.447, "kl": 0.00105}, nonfinite_losses=0, grad_norm=1.0, old_decay=0.0,
                                peak_memory={"train": 1.59, "total": 1.59}, memory_source="process peak RSS")


def test_the_live_bar_keeps_count_elapsed_and_eta_whole_at_80_columns():
    console, out = _console(terminal=True)
    display = TerminalDisplay(console)
    task = display.progress.add_task("", total=30, completed=0)
    for label in ("", "reward 0.8047", "evaluating base weights: 384/1284 images (29%, 7s)"):
        display.progress.update(task, description=label)
        console.print(display.progress.get_renderable())
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines)
    assert all(" 0/30 0:00:00 eta -:--:--" in line for line in lines), lines  # once '0/… 0:… eta -:-…'


def test_the_start_header_and_an_iteration_fit_80_columns_and_verbose_says_it_all():
    console, out = _console()
    display = TerminalDisplay(console)
    display(_started())
    header = out.getvalue().splitlines()
    assert len(header) <= 10, header
    # said when a CPU explores by emulation
    assert "an emulation on a CPU: slower than fp32" in " ".join(out.getvalue().split())
    display(_iteration())
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("iter    1/30  reward 0.8047") and len(line) <= 80, line
    console, out = _console()
    verbose = TerminalDisplay(console, verbose=True)
    verbose(_started())
    verbose(_iteration())
    text = out.getvalue().replace("\n", "")  # lines broken at 80 columns, joined back
    assert "this machine: explore nvfp4-emulated" in text and "explore 1.95s" in text and "peak 1.59 GiB" in text


def _solrl(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    env.pop("SOLRL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "solrl_cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_doctor_is_at_most_40_lines_at_80_columns_and_verbose_has_every_detail():
    short = _solrl("doctor")
    assert short.returncode == 0, short.stdout + short.stderr
    lines = short.stdout.splitlines()
    assert len(lines) <= 40 and all(len(line) <= 80 for line in lines), short.stdout
    assert " fix " not in lines[1]  # no fix column when no check has a fix
    full = _solrl("doctor", "--verbose")
    # the backends' row whole
    assert len(full.stdout.splitlines()) > len(lines) and "numerics only, not fast" in full.stdout


def test_config_help_is_a_summary_and_the_rest_on_request():
    summary = _solrl("config-help")
    lines = summary.stdout.splitlines()
    assert summary.returncode == 0 and len(lines) <= 40, summary.stdout
    assert any(line.startswith("  explore: group_size, steps, precision") for line in lines)
    assert "solrl config-help --all" in summary.stdout.replace("\n    ", " ")
    assert len(_solrl("config-help", "--all").stdout.splitlines()) > 200


def test_explore_prints_a_few_prompts_and_names_the_file_with_the_rest(monkeypatch, tmp_path):
    import torch

    from solrl_cli import explore_cmd

    console, out = _console()
    monkeypatch.setattr(explore_cmd, "console", console)
    prompts = [f"a red circle {i}" for i in range(64)]
    result = type("R", (),
            {"prompts": prompts, "selected": torch.arange(4).repeat(64, 1), "seeds": torch.arange(64 * 8).view(64, 8),
                            "rewards": torch.rand(64, 8), "seconds": 1.0})()
    explore_cmd._print_selection(result, 4, tmp_path)
    text = out.getvalue()
    assert "a red circle 7" in text and "a red circle 8" not in text
    assert f"... and 56 more prompts: every seed of every prompt is in {tmp_path / 'seeds.jsonl'}" in text.replace("\n",
                                                                                                                   "")
    assert len(text.splitlines()) <= 30


def test_the_tui_header_puts_the_eta_beside_the_count_and_says_why_an_explore_is_slow():
    from dataclasses import replace

    from solrl_cli.tui.state import RunState
    from solrl_core.config.convert import to_dict
    from solrl_core.config.presets import resolve_config

    state = RunState()
    config = to_dict(resolve_config("tiny", "sol_rl"))
    state.apply(replace(_started(), config=config, explore_seeds=16, explore_steps=6, keep=8, regenerate=True,
                        full_steps=10))
    slow_explore = {"explore": 12.0, "regenerate": 1.0, "reward": 0.3, "train": 2.0, "total": 15.3}
    state.apply(replace(_iteration(), seconds=slow_explore))
    text = state.progress_text()
    # cut at the end, not the eta
    assert text.startswith("iteration 1/30  eta ~") and text.index("eta") < text.index("reward"), text
    speed = " ".join(state.explore_speed())
    assert (((((((((((((((("below 1x: nvfp4-emulated is an emulation in torch, slower than full precision on this "
                           "device" in speed)))))))))))))))), speed
