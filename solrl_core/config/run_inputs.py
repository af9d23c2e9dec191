"""A run's own inputs, checked in seconds, before the doctor's checks of the machine (which import
diffusers, transformers and every reward backend) and before any model loads: the prompt files, the
device, whether the rewards can judge the prompts (the tiny world's vocabulary), and the remote
reward servers. A mistake in one of them is then said in a second or two, as a config error is.

And the paths a run reads from outside: written absolute into the run's config.toml when it opens
(`absolute_paths`), so `--resume` works from any working folder; on resume, a path that config names
and that is gone is blamed on that config and its key (`check_saved_paths`), not on a flag the user
never gave.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from solrl_core.config.schema import Config
from solrl_core.data.prompts import absolute_spec, load_prompts, missing_path
from solrl_core.errors import SolrlError

# config key -> the flag that sets it, for errors about a fresh run's inputs; API_ARGS: solrl.train()'s keyword
FLAGS = {"run.prompts": "--prompts", "run.eval_prompts": "--set run.eval_prompts=...", "model.path": "--model-path"}
API_ARGS = {"run.prompts": "prompts=", "run.eval_prompts": "eval_prompts=", "model.path": "sets=['model.path=...']"}


def absolute_paths(cfg: Config) -> Config:
    """`cfg` with the local prompt files and folders, model.path and reward.paths that exist written
    as absolute paths (hub ids and set names unchanged)."""
    run = replace(cfg.run, prompts=absolute_spec(cfg.run.prompts), eval_prompts=absolute_spec(cfg.run.eval_prompts))
    model = replace(cfg.model, path=_absolute(cfg.model.path))
    reward = replace(cfg.reward, paths={name: _absolute(p) for name, p in cfg.reward.paths.items()})
    return replace(cfg, run=run, model=model, reward=reward)


def _absolute(path: str) -> str:
    return os.path.abspath(path) if path and Path(path).exists() else path


def _saved_paths(cfg: Config) -> dict[str, str]:
    """Each config key that may name a local path, and the path it names when that path is missing ('' if none)."""
    model = cfg.model.path if cfg.model.path and not Path(cfg.model.path).exists() else ""
    return {"run.prompts": missing_path(cfg.run.prompts), "run.eval_prompts": missing_path(cfg.run.eval_prompts),
            "model.path": model}


def check_saved_paths(run_dir: Path, cfg: Config) -> None:
    """On resume: a local path the run's saved config names (unchanged by --set) must still be there;
    if not, the config file and its key are named, with how to point the run at the new place."""
    from solrl_core.config.convert import load_run_config
    from solrl_core.io.rundir import CONFIG_FILE

    saved = load_run_config(run_dir)
    now = _saved_paths(cfg)
    for key, missing in _saved_paths(saved).items():
        if missing and now[key] == missing:
            raise SolrlError(f"{missing} does not exist: {key} in {run_dir / CONFIG_FILE} names it (the run was "
                             f"started with "
                             f"it{'' if os.path.isabs(missing) else ', relative to the folder it started in'})",
                             f"put it back, or tell the run where it is now: solrl train --resume {run_dir} --set "
                             f"{key}=PATH")


def check_inputs(cfg: Config, resumed_from: Path | None = None, api: bool = False) -> dict[str, list[str]]:
    """The run's inputs, in seconds: saved paths on resume, prompt files (a hub dataset or a set still
    to download is left to the doctor: it may need the network), the device, the rewards' judgement
    of the prompts, a reward of weight 0, and remote reward servers (`api`: errors name solrl.train()'s
    arguments). Raises the first SolrlError. Returns the prompts it read, by their spec (run.prompts,
    run.eval_prompts), so the doctor and the session read no prompt file again."""
    if resumed_from is not None:
        check_saved_paths(resumed_from, cfg)
    _check_weights(cfg)
    named = API_ARGS if api else FLAGS  # the caller's words: solrl.train()'s arguments, or the command line's flags
    read = {spec: local_prompts(spec, named[key]) for key, spec in
            (("run.prompts", cfg.run.prompts), ("run.eval_prompts", cfg.run.eval_prompts)) if spec}
    if cfg.run.device != "auto":
        from solrl_core.runtime.device import resolve_device

        resolve_device(cfg.run.device)
    _check_vocabulary(cfg, [p for texts in read.values() for p in texts])
    _check_servers(cfg)
    return {spec: texts for spec, texts in read.items() if texts}  # [] : a hub dataset or a set still to download


def local_prompts(spec: str, origin: str) -> list[str]:
    """The prompts of `spec` when they are on this machine (a file, a built-in or downloaded set); [] for a
    hub dataset or a set still to download."""
    from solrl_core.data.prompt_sets import download_sets, parse_spec

    parsed = parse_spec(spec)
    if parsed.hub or (not Path(parsed.source).exists() and parsed.source in download_sets()):
        return []
    return load_prompts(spec, origin)


def _check_weights(cfg: Config) -> None:
    """A trained reward of weight 0 is scored and thrown away: the run would learn nothing from it.
    (explore may weight a reward 0 to see its scores beside the ranking.)"""
    if not any(cfg.reward.weights.values()):  # every sample would score 0: nothing to rank, nothing to learn
        raise SolrlError(f"every reward has weight 0 ({', '.join(f'{n}=0' for n in cfg.reward.weights)}): "
                         "no sample would score above another", "give a reward a weight, e.g. --reward NAME=1.0")
    zero = [name for name, weight in cfg.reward.weights.items() if weight == 0]
    if zero:
        raise SolrlError(f"reward {zero[0]} has weight 0: training would score it and learn nothing from it",
                         f"drop it from the rewards, give it a weight ({zero[0]}=1.0), or score it without training on "
                         f"it: run.eval_rewards={zero[0]}")


def _check_vocabulary(cfg: Config, prompts: list[str]) -> None:
    """Rewards that need no weights are built (cheap) and asked whether they can judge the prompts."""
    from solrl_core.rewards import build_reward
    from solrl_core.rewards.registry import BUILTIN

    for name in cfg.reward.weights:
        if name not in BUILTIN or BUILTIN[name].needs_weights or not prompts:
            continue  # a URL reward, a plugin (checked when the run's rewards are built) or a model reward
        check = getattr(build_reward(name), "check_prompts", None)
        if check is not None:
            check(prompts)


def _check_servers(cfg: Config) -> None:
    """A remote: or vlm: reward's server answers its health request (the request the doctor makes),
    within reward.timeout_s when that is set (a number above 0), else the doctor's limit (10 s)."""
    from solrl_core.rewards.endpoints import is_endpoint
    from solrl_core.rewards.probe import PROBE_TIMEOUT_S, probe_endpoint
    from solrl_core.rewards.timeouts import parse_timeout
    from solrl_core.rewards.transport import Unreachable

    limit = parse_timeout(cfg.reward.timeout_s) or PROBE_TIMEOUT_S  # auto or 0 (no watchdog): the doctor's limit
    for name in filter(is_endpoint, cfg.reward.weights):
        try:
            probe_endpoint(name, cfg.reward.remote, limit, video=cfg.model.frames > 0)
        except Unreachable as exc:  # nothing has started: the same command (a resume included) is the next step
            raise SolrlError(f"reward endpoint {name}: {exc.message}", f"{Unreachable.START}, then run the same "
                                                                       f"command again") from exc
        except SolrlError as exc:
            raise SolrlError(f"reward endpoint {name}: {exc.message}",
                             exc.fix or "run `solrl doctor` for details") from exc
