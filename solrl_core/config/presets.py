"""Presets are TOML files on disk, found by name; a run's config is layered from them. A reward
preset is a reward declared in the registry (rewards/registry.py: the built-ins and the installed
plugins): it weights that one reward 1.0, so no file repeats what the registry says.

Precedence, lowest first: dataclass defaults < model preset < family preset < reward preset <
`--config FILE` < `--set section.key=value` < explicit CLI flags. A preset name
`<model>_<family>_<reward>` names the three parts at once.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import tomllib

from solrl_core.config.convert import from_dict, set_value
from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError, close_matches
from solrl_core.rewards.names import is_weight_list, label, parse_weights
from solrl_core.rewards.registry import RewardInfo, registry

KINDS = ("models", "families", "rewards")


@dataclass(frozen=True)
class Preset:
    kind: str
    name: str
    description: str
    values: dict[str, Any]
    path: str


def _preset_root() -> Any:
    return resources.files("solrl_presets")


def list_presets(kind: str | None = None) -> list[Preset]:
    """Every shipped preset of one kind (or all), sorted by name."""
    out = []
    for k in ([kind] if kind else KINDS):
        if k == "rewards":
            out += [_reward_preset(info) for info in sorted(registry().values(), key=lambda r: r.name)]
            continue
        folder = _preset_root() / k
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".toml"):
                out.append(_read(k, entry))
    return out


def _read(kind: str, entry: Any) -> Preset:
    try:
        data = tomllib.loads(entry.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:  # a broken shipped file is our bug, but say where
        raise SolrlError(f"preset file {entry} is not valid TOML: {exc}", "reinstall solrl") from exc
    description = str(data.pop("description", ""))
    return Preset(kind, entry.name[:-5], description, data, str(entry))


def _reward_preset(info: RewardInfo) -> Preset:
    needs = f"; weights: {info.weights}" if info.weights else "; needs no weights" if info.build else ""
    extra = f"; needs solrl[{info.extra}]" if info.extra else ""
    return Preset("rewards", info.name, f"{info.description}{needs}{extra}", {"reward": {"weights": {info.name: 1.0}}},
                  info.origin)


def names(kind: str) -> list[str]:
    return [p.name for p in list_presets(kind)]


def get_preset(kind: str, name: str) -> Preset:
    if kind == "rewards" and name in registry():
        return _reward_preset(registry()[name])
    entry = _preset_root() / kind / f"{name}.toml"
    if kind == "rewards" or not entry.is_file():
        singular = kind[:-1] if kind != "families" else "family"
        raise SolrlError(f"unknown {singular} '{name}'", close_matches(name, names(kind)) + " (list them with: solrl "
                                                                                            "presets)")
    return _read(kind, entry)


def split_preset_name(name: str) -> tuple[str, str, str]:
    """'tiny_sol_rl_jpeg_compressibility' -> ('tiny', 'sol_rl', 'jpeg_compressibility')."""
    for model in sorted(names("models"), key=len, reverse=True):
        if not name.startswith(model + "_"):
            continue
        rest = name[len(model) + 1:]
        for family in sorted(names("families"), key=len, reverse=True):
            if rest.startswith(family + "_") and rest[len(family) + 1:] in names("rewards"):
                return model, family, rest[len(family) + 1:]
    every = [f"{m}_{f}_{r}" for m in names("models") for f in names("families") for r in names("rewards")]
    begun = sorted((n for n in every if n.startswith(name)), key=len)[:12]  # a name cut short: tiny_sol_rl_jpeg
    # the closest names only: there are hundreds
    near = begun + difflib.get_close_matches(name, every, n=12, cutoff=0.5)
    # a combination the config refuses (a video model, an image reward) is no help
    near = [n for n in dict.fromkeys(near) if _resolves(n)][:3]
    guess = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
    raise SolrlError(f"unknown preset '{name}'", f"{guess}names are <model>_<family>_<reward>, e.g. "
                                                 f"tiny_sol_rl_tinyworld_geneval; "
                                                 "`solrl presets` lists each part")


def _resolves(preset: str) -> bool:
    try:
        resolve_config(preset=preset)
    except SolrlError:
        return False
    return True


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or YAML config file into a nested dict."""
    p = Path(path)
    if not p.is_file():
        raise SolrlError(f"config file {p} does not exist", "check the path given to --config")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SolrlError(f"config file {p} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}): "
                         "is it a binary file?", "give --config a .toml or .yaml text file") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            data = _load_yaml(p, text)
        elif p.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise SolrlError(f"config file {p} must end in .toml, .yaml or .yml", "rename it or convert it")
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise SolrlError(f"config file {p} could not be parsed: {exc}", "fix the syntax error it names") from exc
    if not isinstance(data, dict):
        raise SolrlError(f"config file {p} must hold a table of sections", "see `solrl train --dump-config` for the "
                                                                           "layout")
    return data


def _load_yaml(path: Path, text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SolrlError(f"config file {path} could not be parsed{where}: {what}", "fix the YAML syntax there") from exc


def resolve_config(
    model: str | None = None,  # None: tiny
    family: str | None = None,  # None: sol_rl
    reward: str | None = None,
    preset: str | None = None,
    config_file: str | Path | None = None,
    sets: Iterable[str] = (),
    flags: dict[str, dict[str, Any]] | None = None,
) -> Config:
    """Build and validate a run config from presets, a file, --set overrides and explicit flags. With
    `preset`, a model, family or reward also given must be the preset's own (None: not given)."""
    if preset:
        named = split_preset_name(preset)
        for what, given, own in zip(("model", "family", "reward"), (model, family, reward), named):
            if given is not None and given != own:
                raise SolrlError(f"preset {preset} names {what} {own}, and {what} {given} was given too",
                                 f"give the preset alone, or the {what} without the preset (with the other two parts)")
        model, family, reward = named
    model, family = model or "tiny", family or "sol_rl"
    parts = [get_preset("models", model), get_preset("families", family)]
    weights = None
    if reward and is_weight_list(reward):
        weights = parse_weights(reward)  # several rewards: 'imagereward=1.0,pickscore=0.5', or remote:URL
    elif reward:
        parts.append(get_preset("rewards", reward))
    config = Config()
    for part in parts:
        config = from_dict(part.values, config, source=f"preset {part.kind}/{part.name}")
    if weights is not None:
        config = from_dict({"reward": {"weights": weights}}, config, source="--reward")
    rewards = "+".join(map(label, config.reward.weights)) if weights else reward or next(iter(config.reward.weights))
    name = f"{model}_{family}_{rewards}"
    config = from_dict({"preset": name, "model": {"name": model}}, config)
    if config_file:
        config = from_dict(load_config_file(config_file), config, source=str(config_file))
    return apply_overrides(config, sets, flags)


def resumed_config(run_dir: str | Path, sets: Iterable[str] = (), flags: dict[str, dict[str, Any]] | None = None, *,
                   reward: str | None = None, trust: bool = False, api: bool = False) -> Config:
    """The config saved in `run_dir` with a resume's overrides, refused where they would change what
    the run's checkpoints fix (convert.check_resume_overrides) or where the folder names code or a URL
    the user has not accepted (run_trust.py: `reward` given again, or `trust`). `solrl train --resume`
    and the Python API both resume through this."""
    from solrl_core.config.convert import check_resume_overrides, load_run_config
    from solrl_core.config.trust import check_trusted

    saved, sets = load_run_config(run_dir), tuple(sets)
    if reward:
        flags = {**(flags or {}), "reward": reward_flag(reward, saved)}
    resumed = apply_overrides(saved, sets, flags)
    check_resume_overrides(saved, resumed, run_dir)
    check_trusted(run_dir, resumed, overlay(Config(), sets, flags), trust, api)
    return resumed


def reward_weights(reward: str) -> dict[str, float]:
    """--reward: a reward preset or reward name, or NAME=W,NAME=W."""
    if is_weight_list(reward):
        return parse_weights(reward)
    return dict(get_preset("rewards", reward).values["reward"]["weights"])


def reward_flag(reward: str, saved: Config) -> dict[str, Any]:
    """--reward over a run's saved config: its weights, with the saved weights paths of the rewards it keeps."""
    weights = reward_weights(reward)
    return {"weights": weights, "paths": {k: v for k, v in saved.reward.paths.items() if k in weights}}


def apply_overrides(config: Config, sets: Iterable[str] = (), flags: dict[str, dict[str, Any]] | None = None) -> Config:
    """`--set section.key=value` assignments, then explicit flags (None values left out), over
    `config`; validated. Every command applies its overrides through this."""
    return overlay(config, sets, flags).validate()


def overlay(config: Config, sets: Iterable[str] = (), flags: dict[str, dict[str, Any]] | None = None) -> Config:
    """`apply_overrides` without the validation: over the defaults, what a command line alone names."""
    for assignment in sets:
        config = set_value(config, assignment)
    flags = {k: {n: v for n, v in vals.items() if v is not None} for k, vals in (flags or {}).items()}
    if any(flags.values()):
        config = from_dict({k: v for k, v in flags.items() if v}, config, source="command-line flags")
    return config
