"""The `solrl` command: thin commands over solrl_core."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from solrl_cli import options as opt
from solrl_cli.errors import user_errors

app = typer.Typer(name="solrl", no_args_is_help=False, add_completion=False, pretty_exceptions_enable=False,
                  help="Sol-RL post-training for text-to-image flow models: FP4 explore, full-precision train.")
console = Console(highlight=False, soft_wrap=True)

PRECEDENCE = "defaults < model preset < family preset < reward preset < --config FILE < --set < explicit flags"


@app.command()
def train(
    model: opt.Model = None,
    family: opt.Family = None,
    reward: opt.Reward = None,
    preset: opt.Preset = None,
    config: opt.ConfigFile = None,
    set_: opt.Sets = None,
    prompts: opt.Prompts = None,
    run_dir: opt.RunDir = None,
    iterations: opt.Iterations = None,
    seed: opt.Seed = None,
    device: opt.Device = None,
    explore_precision: opt.ExplorePrecision = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue the run in this folder from its newest checkpoint.")] = None,
    dump_config: Annotated[bool, typer.Option("--dump-config", help="Print the resolved config as TOML and exit.")] = False,
) -> None:
    """Train with Sol-RL (or another family). With no arguments: the built-in tiny model on this machine."""
    from solrl_core import events
    from solrl_core.presets import resolve_config
    from solrl_core.session import load_run_config
    from solrl_core.trainer import train as run_training
    from solrl_cli.display import TerminalDisplay

    with user_errors():
        flags = {"run": {"prompts": prompts, "run_dir": str(run_dir) if run_dir else None, "iterations": iterations,
                         "seed": seed, "device": device},
                 "explore": {"precision": explore_precision}}
        flags = {sec: {k: v for k, v in vals.items() if v is not None} for sec, vals in flags.items()}
        if resume:
            cfg = _resume_config(resume, load_run_config(resume), model, family, reward, preset, config, set_, flags)
        else:
            cfg = resolve_config(model or "tiny", family or "sol_rl", reward, preset, config, set_ or (), flags)
        if dump_config:
            _print_config(cfg)
            return
        bus = events.EventBus()
        bus.subscribe(TerminalDisplay(console))
        session = run_training(cfg, bus, resume=bool(resume))
        if session.iteration < session.config.run.iterations:
            raise typer.Exit(130)  # stopped by a signal: saved, but not finished


def _resume_config(run_dir, saved, model, family, reward, preset, config, sets, flags):  # type: ignore[no-untyped-def]
    from solrl_core.config import from_dict, set_value
    from solrl_core.errors import SolrlError

    if any((model, family, reward, preset, config)) or set(flags["run"]) - {"iterations", "device"} or flags["explore"]:
        raise SolrlError("--resume continues a run with the config saved in its folder",
                         "only --iterations, --device and --set may be given with --resume")
    cfg = saved
    for assignment in sets or ():
        cfg = set_value(cfg, assignment)
    return from_dict({"run": {**flags["run"], "run_dir": str(run_dir)}}, cfg, source="command-line flags").validate()


def _print_config(cfg) -> None:  # type: ignore[no-untyped-def]
    import tomli_w

    from solrl_core.config import to_dict

    print(f"# solrl resolved config for preset {cfg.preset}\n# precedence: {PRECEDENCE}")
    print(tomli_w.dumps(to_dict(cfg)), end="")


@app.command()
def presets() -> None:
    """List the built-in model, family and reward presets and prompt sets."""
    from solrl_core.presets import list_presets
    from solrl_core.prompts import builtin_sets

    with user_errors():
        table = Table(title="solrl presets  (combine as --model M --family F --reward R, or --preset M_F_R)")
        table.add_column("kind")
        table.add_column("name", style="cyan")
        table.add_column("description")
        for p in list_presets():
            table.add_row(p.kind[:-1] if p.kind != "families" else "family", p.name, p.description)
        for name in builtin_sets():
            table.add_row("prompts", name, "built-in prompt set (--prompts NAME)")
        console.print(table)
        console.print(f"precedence: {PRECEDENCE}")


@app.command("config-help")
def config_help() -> None:
    """Every setting `--set section.key=value` accepts, with its default and meaning."""
    from solrl_core.config import help_table

    table = Table(title="settings")
    for col in ("key", "default", "meaning"):
        table.add_column(col)
    for row in help_table():
        table.add_row(*row)
    console.print(table)


def _quiet_third_party() -> None:
    """Library chatter (optional-backend probes, deprecations) is not the user's business."""
    if os.environ.get("SOLRL_DEBUG", "") in ("", "0"):
        # diffusers and transformers reset their loggers' level on import: their own variables win.
        os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        for name in ("torchao", "diffusers", "transformers", "torch.utils._pytree", "peft"):
            logging.getLogger(name).setLevel(logging.ERROR)


def main() -> None:
    _quiet_third_party()
    app()


if __name__ == "__main__":
    main()
