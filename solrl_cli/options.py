"""Options shared by commands, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

Model = Annotated[Optional[str],
                  typer.Option("--model", "-m", help="Model preset (see `solrl presets`). Default: tiny.")]
Family = Annotated[Optional[str], typer.Option("--family", "-f", help="Family preset: sol_rl, naive_scaling, compile, "
                                                                      "naive_quant, diffusionnft. Default: sol_rl.")]
Reward = Annotated[Optional[str], typer.Option("--reward", "-r", help="Reward, or several with weights: "
                                                                      "imagereward=1.0,pickscore=0.5. A reward of your "
                                                                      "own: mypkg.rewards:fn, path/file.py:fn, or the "
                                                                      "name of an installed solrl.rewards entry point "
                                                                      "(docs/rewards.md). Default: the model preset's "
                                                                      "reward.")]
ModelPath = Annotated[Optional[Path], typer.Option("--model-path", help="Local folder with the base model in the hub's "
                                                                        "diffusers layout (instead of downloading its "
                                                                        "hub id).")]
Preset = Annotated[Optional[str], typer.Option("--preset", help="All three at once: <model>_<family>_<reward>.")]
ConfigFile = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML or YAML file of settings, applied "
                                                                           "over the presets.")]
Sets = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override one setting: section.key=value "
                                                                       "(repeatable).")]
Prompts = Annotated[Optional[str], typer.Option("--prompts", "-p", help="Prompt set: a name from `solrl presets`, a "
                                                  ".txt / .jsonl / .parquet / .csv file or save_to_disk folder "
                                                  "(PATH:COLUMN, DIR@SPLIT:COLUMN), or hf:OWNER/NAME@SPLIT:COLUMN "
                                                  "(split, column optional; docs/prompts.md).")]
RunDir = Annotated[Optional[Path],
                   typer.Option("--run-dir", "-o", help="Output folder. Default: runs/<time>-<preset>.")]
Iterations = Annotated[Optional[int], typer.Option("--iterations", "-n", min=1, help="Training iterations.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Run seed.")]
Device = Annotated[Optional[str], typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
ExplorePrecision = Annotated[Optional[str], typer.Option("--explore-precision", help="auto, fp8 (GPU, compute "
                                                                                     "capability >= 8.9), "
                                                                                     "nvfp4-emulated, fp8-e5m2-tensor, "
                                                                                     "fp8-e5m2-delayed (the official "
                                                                                     "recipe), bf16 or fp32.")]
Checkpoint = Annotated[Optional[str], typer.Option("--checkpoint", help="Checkpoint folder name (iter_000030) or path. "
                                                                        "Default: the newest.")]
Best = Annotated[bool, typer.Option("--best", help="The checkpoint with the highest trained-reward gain among those "
                                                   "whose evaluation no reward-hacking rule flagged "
                                                   "(docs/rewards.md).")]
Out = Annotated[Optional[Path], typer.Option("--out", "-o", help="Output folder. Default: RUN/<command>/<time>, or "
                                                                 "runs/<command>-<time> without a RUN.")]
Weights = Annotated[str, typer.Option("--weights", help="Tuned weights beside the base: ema, trained or ema,trained.")]
EvalSteps = Annotated[Optional[int],
                      typer.Option("--steps", min=1, help="Sampling steps. Default: sampler.eval_steps.")]
Prompt = Annotated[Optional[list[str]], typer.Option("--prompt", help="A prompt (repeatable).")]
TrustRunConfig = Annotated[bool, typer.Option("--trust-run-config", help="Use the reward plugins (code) and URL "
                                              "rewards the run folder's config.toml names: without it they are refused "
                                              "until given again with --reward (a folder is data: docs/reliability.md, "
                                              "Threats).")]


class _UnlabelledHelp:
    """Typer labels its own --help flag `<bool>` (a flag takes no value, so it gets no label here)."""

    def get_help_option(self, ctx):  # type: ignore[no-untyped-def]
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option


class _NamedArgument(typer.core.TyperArgument):
    """An argument shown by its name (RUN, RUNS), which says what to type, without Typer's type
    label (`<path>`, `<list[Path]>`), which says Python."""

    def display_type_rich(self, ctx):  # type: ignore[no-untyped-def]
        return None


class Command(_UnlabelledHelp, typer.core.TyperCommand):
    """A command whose --help is unlabelled and whose arguments go by their upper-case names."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is typer.core.TyperArgument:
                param.__class__ = _NamedArgument
                if param.metavar is None:
                    param.metavar = param.name.upper()


class Group(_UnlabelledHelp, typer.core.TyperGroup):
    """The app, its --help unlabelled."""


def plain_labels(command):  # type: ignore[no-untyped-def]
    """`command` with a plain value label on each of its options that names none (TEXT, N, PATH; none on a
    flag), instead of Typer's type labels (`<list[str]>`, `<bool>`), which say Python, not what to type.
    Typer shows an argument's metavar as its name and still labels its type, so arguments keep theirs."""
    import typing

    # a string annotation makes a new OptionInfo each time read
    hints = typing.get_type_hints(command, include_extras=True)
    for name, hint in hints.items():
        if name == "return" or typing.get_origin(hint) is not Annotated:
            continue
        base, *meta = typing.get_args(hint)
        for info in meta:
            if isinstance(info, typer.models.OptionInfo) and info.metavar is None:  # an argument's metavar renames it
                info.metavar = _label(base)
    command.__annotations__ = hints  # the labelled ones, which Typer then reads
    return command


def _label(hint: object) -> str:
    import typing

    while typing.get_origin(hint) in (typing.Union, list):  # Optional[X] and list[X] (a repeatable option): X's label
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    names = {bool: "", int: "N", float: "NUMBER"}
    return names.get(hint, "PATH" if hint is Path else "TEXT")  # type: ignore[call-overload]
