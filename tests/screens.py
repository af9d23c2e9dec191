"""Made-up run events for the TUI's tests, and the text a screen or a console shows."""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

from rich.console import Console

from solrl_core import events as ev

if TYPE_CHECKING:
    from solrl_cli.tui.app import SolrlMonitor


SIZE = (160, 45)


CONFIG = {"algorithm": {"family": "sol_rl"}, "run": {"prompts_per_iteration": 8},
          "explore": {"group_size": 16, "steps": 6},
          "selection": {"group_size": 8}, "sampler": {"steps": 10}, "reward": {"weights": {"tinyworld_geneval": 1.0}}}


def iteration(i: int, total: int = 30) -> ev.IterationFinished:
    seconds = {"explore": 2.0 + i / 100, "selection": 0.001, "regenerate": 1.0 + i / 100, "reward": 0.2, "train": 1.5,
               "sync": 0.02, "total": 4.75 + i / 50}
    def stats(mean: float) -> ev.RewardStats:
        return ev.RewardStats(mean=mean, std=0.3, best=1.0, worst=0.0, components={"tinyworld_geneval": mean})
    return ev.IterationFinished(iteration=i, iterations=total, seconds=seconds, draft=stats(0.4 + i / 100),
                                final=stats(0.5 + i / 100),
                                loss={"loss": 1.5 - i / 100, "policy": 1.49 - i / 100, "kl": 0.001 * i},
                                nonfinite_losses=0, grad_norm=0.2, old_decay=0.001 * (i - 1))


ENVIRONMENT = {  # what solrl_core.plan.environment.describe records, for a made-up H100 machine
    "python": "3.12.3", "platform": "Linux-6.8-x86_64", "torch_cuda": "12.8", "device": "cuda:0",
    "libraries": {"torch": "2.9.0", "diffusers": "0.35.1", "transformers": "4.57.0", "peft": "0.17.1",
                  "torchao": "0.13.0", "transformer_engine": None, "solrl": "0.1.0"},
    "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.2, "run": True,
              "precisions": {"nvfp4": [False, "compute capability 9.0 < 10.0"], "fp8": [True, "torch._scaled_mm"],
                             "nvfp4-emulated": [True, "anywhere"], "bf16": [True, "9.0"], "fp32": [True, "always"]}}],
    "cpu_precisions": None,
    "explore": {"requested": "auto", "resolved": "nvfp4-emulated", "full_precision": "bf16",
                "implemented": ["fp8", "nvfp4-emulated", "bf16", "fp32"]},
    "transformer_engine": {"installed": False, "version": None,
                           "reason": "not installed: pip install transformer-engine[pytorch]",
                           "nvfp4": None, "fp8": None},
    "torchao": {"installed": True, "version": "0.13.0", "reason": "", "sm_at_least_89": True, "sm_at_least_100": False},
    "memory_estimate_gib": 21.4,
}


def started(run_dir: str = "runs/x", start_iteration: int = 0, resumed: bool = False) -> ev.RunStarted:
    return ev.RunStarted(run_dir=run_dir, preset="tiny_sol_rl_tinyworld_geneval", device="cpu", dtype="fp32",
                         explore_precision="nvfp4-emulated",
                         plan="Stage 1: 16 seeds/prompt at nvfp4-emulated, 6 steps -> keep 8",
                         start_iteration=start_iteration, iterations=30, resumed=resumed, config=CONFIG,
                         environment=ENVIRONMENT,
                         explore_seeds=16, explore_steps=6, keep=8, regenerate=True, full_steps=10)


def screen_text(app: SolrlMonitor, size: tuple[int, int] = SIZE) -> str:
    """The app's screen as text, on a terminal of `size` (columns, lines)."""
    console = Console(width=size[0], height=size[1], file=io.StringIO(), record=True, force_terminal=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


SMALL = (80, 24)


def text_of(app: SolrlMonitor) -> str:
    return screen_text(app, SMALL)


NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")


def consoles() -> list[Console]:
    """An 80-column terminal, and a pipe (not a terminal: rich's own width, COLUMNS unset)."""
    return [Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None, highlight=False,
                    markup=False),
            Console(file=io.StringIO(), highlight=False, markup=False)]


def printed(console: Console) -> str:
    text = console.file.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "…" not in text, text
    return text


def tokens(text: str) -> list[str]:
    return [m.group() for m in NUMBER.finditer(text)]
