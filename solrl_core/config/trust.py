"""A run folder is data: what its config.toml names that would run code or send data away is used
only when the user says so, on the command line of the command that opens the folder.

Two settings can name such a thing: `reward.weights` and `run.eval_rewards`. A reward name there that
is not a built-in is a plugin by its code (`path/file.py:fn`, `pkg.module:fn`: imported, it runs with
the user's permissions), an installed plugin by its entry-point name (its package's code), or a URL
reward: `remote:URL` is sent the prompts, the images and SOLRL_REWARD_TOKEN, `vlm:URL` the prompts, the
images and OPENAI_API_KEY. Every other setting is read as data: model.path, model.weights and
reward.paths name weights read as safetensors, JSON or through torch's weights-only loader; a hub id
(model.hub_id, an `hf:` prompt set) is fetched from the hub the environment names (HF_ENDPOINT), never
from a host the folder picks; a download prompt set's URL is declared in solrl's own files
(presets/prompts/downloads.toml), its download checked against a hash.

`check_trusted` is called by every command that opens a run folder and builds its rewards (`solrl train
--resume`, `solrl.train(resume=...)`, `eval`, `explore`, `rank-check`), before any model loads and
before any reward is built or probed. A name the command line gives again (`--reward`, `--set`,
`eval --rewards`) is the user's, as is every name with `--trust-run-config` (`trust_run_config=True`).
`infer`, `export`, `monitor` and `compare` never build a run's rewards, so there is nothing to accept.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError
from solrl_core.rewards.endpoints import API_KEY_ENV, TOKEN_ENV, is_endpoint, split_name
from solrl_core.rewards.registry import BUILTIN, is_plugin_ref, lookup, split_ref

FLAG = "--trust-run-config"
KEYS = ("reward.weights", "run.eval_rewards")  # the settings that may name code or a URL


def references(cfg: Config) -> dict[str, str]:
    """Each reward `cfg` names that is code or a URL (anything but a built-in) -> the setting naming it."""
    found: dict[str, str] = {}
    for key, names in zip(KEYS, (cfg.reward.weights, cfg.run.eval_rewards)):
        for name in names:
            if name not in BUILTIN:
                found.setdefault(name, key)
    return found


def check_trusted(run_dir: str | Path, used: Config, given: Config, trust: bool, api: bool = False) -> None:
    """Refuse, in one line, the first reward of `used` (the config a command runs with) that is code or
    a URL and that the user did not name: `given` is the defaults with only this command's --reward,
    --set and flags applied, so what it names came from the user, the rest from the run folder.
    `trust`: --trust-run-config (the Python API's trust_run_config=True) accepts them all. `api`: say
    how to accept in the Python API's words."""
    if trust:
        return
    mine = references(given)
    for name, key in references(used).items():
        if name not in mine:
            raise SolrlError(f"{Path(run_dir) / 'config.toml'} ({key}) names {_refused(name)}: a run folder's "
                             "config is data, not used until you accept it", _how_to_accept(run_dir, used, key, api))


def _refused(name: str) -> str:
    """What a reward name would make solrl run or contact, for the refusal."""
    if is_endpoint(name):
        kind, _ = split_name(name)
        secret = TOKEN_ENV if kind == "remote" else API_KEY_ENV
        return (f"the {'reward server' if kind == 'remote' else 'VLM judge'} {name}, which would be sent the prompts, "
                f"the images and {secret}")
    return f"the reward plugin {name}, whose code ({code_of(name)}) would run"


def code_of(name: str) -> str:
    """What a reward runs or contacts: a built-in or a URL reward by its name, a plugin file by its
    absolute path and function, a module plugin by its module and function, an entry point by its target."""
    if name in BUILTIN or is_endpoint(name):
        return name
    if is_plugin_ref(name):
        where, attr = split_ref(name)
        return f"{os.path.abspath(os.path.expanduser(where))}:{attr}" if where.endswith(".py") else name
    info = lookup(name)
    return f"{name} ({info.origin})" if info is not None else name


def scored(cfg: Config) -> list[str]:
    """The rewards a run trains on as what each runs or contacts, with its weight (the start-up line)."""
    return [f"{code_of(name)} (weight {w:g})" for name, w in cfg.reward.weights.items()]


def _how_to_accept(run_dir: str | Path, cfg: Config, key: str, api: bool) -> str:
    """The two ways to accept: trust the whole folder, or name the setting again on the command line."""
    if key == "reward.weights":
        weights = ",".join(f"{n}={w!r}" for n, w in cfg.reward.weights.items())
        again = f"reward={weights!r}" if api else f"--reward {shlex.quote(weights)}"
    else:
        names = ",".join(cfg.run.eval_rewards)
        again = (f"sets=[{f'run.eval_rewards={names}'!r}]" if api else f"--set "
                                                                       f"{shlex.quote(f'run.eval_rewards={names}')}")
    trust = "trust_run_config=True" if api else FLAG
    return (f"if you trust {run_dir}, pass {trust} (it runs every plugin and contacts every URL its config.toml "
            f"names), or name them yourself: {again}")
