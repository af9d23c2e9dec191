"""How a command that reads a run folder (eval, infer, export, explore, rank-check) finds what it
works on: the run's config (or a base model preset's) with the command's overrides, its checkpoint
(--checkpoint, --best), the prompts, the output folder and the rewards. The core functions of those
commands (tools/evaluate.py, inference.py, explore.py, rank_check.py, export.py) take them from here,
whichever front asked: `solrl` on the command line or the Python API."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Optional


def weight_sets(text: str) -> tuple[str, ...]:
    """--weights: ema, trained, or both."""
    from solrl_core.errors import SolrlError

    sets = tuple(w.strip() for w in text.split(",") if w.strip())
    if not sets or any(w not in ("ema", "trained") for w in sets):
        raise SolrlError(f"--weights {text}: expected ema, trained or both", "for example --weights ema,trained")
    return sets


def tool_config(run: Optional[Path], model: Optional[str], model_path: Optional[Path], checkpoint: Optional[str], *,
                reward: Optional[str] = None, sets: Optional[list[str]] = None,
                flags: Optional[dict[str, dict[str, Any]]] = None,
                trust: Optional[bool] = None) -> tuple[Any, Optional[Path]]:
    """The config and checkpoint of a run folder (or of a base model preset, with no checkpoint),
    with --reward, --set and the command's flags applied over it. A command that builds the rewards
    passes `trust` (--trust-run-config): a run folder's plugins and URL rewards are refused unless
    given again or trusted (config/trust.py); None: the command builds none (infer, export)."""
    from solrl_core.config.convert import load_run_config
    from solrl_core.config.presets import apply_overrides, overlay, resolve_config, reward_flag
    from solrl_core.config.schema import Config
    from solrl_core.config.trust import check_trusted
    from solrl_core.errors import SolrlError

    if run is not None:
        if model:
            raise SolrlError("--model is taken from the run's saved config",
                             "drop --model, or omit RUN to use a base model")
        cfg = load_run_config(run)
    else:
        if checkpoint:
            raise SolrlError("--checkpoint needs a RUN folder", "pass the run folder as the first argument")
        cfg = resolve_config(model or "tiny", "sol_rl")
    flags = {**(flags or {}), "model": {"path": str(model_path) if model_path else None}}
    if reward:
        flags["reward"] = reward_flag(reward, cfg)
    used = apply_overrides(cfg, sets or (), flags)
    if run is None:
        return used, None
    if trust is not None:  # before torch loads: a refusal costs a second
        check_trusted(run, used, overlay(Config(), sets or (), flags), trust)
    from solrl_core.io.rundir import list_checkpoints  # torch-free: a wrong --checkpoint is said in a second

    return used, _pick_checkpoint(run, list_checkpoints(run), checkpoint)


def pick_best(run: Optional[Path], checkpoint: Optional[str], best: bool) -> tuple[Optional[str], str, list[str]]:
    """--best: the name of the run's checkpoint with the highest trained-reward gain among those no hacking
    rule flagged, why (written on a model card) and the lines to say (the checkpoints whose records do not
    match, then the choice); without it, --checkpoint as given."""
    from solrl_core.errors import SolrlError

    if not best:
        return checkpoint, "", []
    if run is None or checkpoint:
        raise SolrlError("--best and --checkpoint both choose the checkpoint: give one of them" if checkpoint
                         else "--best picks among a run's checkpoints, and no run folder was given",
                         "drop --checkpoint" if checkpoint else "pass the run folder as the first argument")
    from solrl_core.loop.hacking import best_checkpoint  # torch: a run folder's checkpoints are read with it

    path, why, mismatched = best_checkpoint(run)
    return path.name, why, [*(f"warning: {line}" for line in mismatched), f"--best: {why}"]


def prompt_texts(prompt: Optional[list[str]], prompts: Optional[str], default: str) -> list[str]:
    """The --prompt texts, else the --prompts file or set, else `default` (a prompt set or file)."""
    from solrl_core.data.prompts import load_prompts
    from solrl_core.errors import SolrlError

    if prompt and prompts:
        raise SolrlError("both --prompt and --prompts given",
                         "use one: --prompt TEXT (repeatable) or --prompts FILE_OR_SET")
    if prompt and not all(p.strip() for p in prompt):
        raise SolrlError("--prompt is empty", f"give the text of the image, e.g. --prompt '{example_prompt(default)}'")
    return list(prompt or []) or load_prompts(prompts or default)


def example_prompt(spec: str) -> str:
    """A prompt the model accepts: the first of its own prompt set where that is on this machine (the
    tiny models know only their world's words), else a plain one."""
    from solrl_core.config.run_inputs import local_prompts
    from solrl_core.errors import SolrlError

    try:
        return next(iter(local_prompts(spec, "--prompts") if spec else ()), "a red cube left of a blue sphere")
    except SolrlError:  # its prompt file is gone: the error at hand is still the empty --prompt
        return "a red cube left of a blue sphere"


def output_folder(out: Optional[Path], run: Optional[Path], kind: str) -> Path:
    """--out, else RUN/<kind>/<time> for a run, else runs/<kind>-<time>."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(out or (run / kind / stamp if run is not None else Path("runs") / f"{kind.replace('_', '-')}-{stamp}"))


def reward_set(cfg: Any) -> Any:
    """The config's rewards, loaded on its device."""
    from solrl_core.rewards import RewardSet
    from solrl_core.runtime.device import resolve_device

    return RewardSet.from_config(cfg.reward, resolve_device(cfg.run.device))


def _pick_checkpoint(run: Path, found: list[Path], name: Optional[str]) -> Path:
    from solrl_core.errors import SolrlError
    from solrl_core.faults.manifest import verify
    from solrl_core.io.rundir import pick_checkpoint

    if not found:
        raise SolrlError(f"{run} holds no complete checkpoint", "train it for at least one checkpoint interval first")
    path = pick_checkpoint(run, found, name)
    problem = verify(path)
    if problem is not None:
        raise SolrlError(f"checkpoint {path.name} is torn or corrupt ({problem})",
                         "pick another with --checkpoint: " + ", ".join(p.name for p in found if p != path))
    return path
