"""Rewards score a batch of images against their prompts: one float per image.

A reward is any object with a `name` and `__call__(images, prompts) -> Tensor[B]`, where images are
float tensors [B, 3, H, W] in [0, 1] on any device, and the result is a float32 CPU tensor. Model
rewards run on the context's device, in eval mode, under no_grad. Optionally a reward has
`check_prompts(prompts)` (rejects prompts it cannot score, called before a run writes anything) and
`summary(scores, prompts) -> dict` (named statistics for evaluations, e.g. GenEval-style strict
accuracy and the mean per kind of prompt) and `groups(prompts) -> {name: indices}` (the images behind
each per-group mean, so an evaluation can give each group's change a standard error).

Each reward registers one `RewardSpec`: how to build it from a `RewardContext` (device, dtype and an
optional local path for its weights), where its weights come from, and what it needs installed.
Heavy backends are imported only when built, so `import solrl_core` stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from solrl_core.errors import SolrlError, close_matches
from solrl_core.faults.phase import charged_to
from solrl_core.reward_endpoints import is_endpoint
from solrl_core.reward_names import REWARDS, check_names, parse_weights
from solrl_core.rewards.base import Reward, RewardContext
from solrl_core.rewards.watchdog import call_watched, timeout_for

__all__ = ["SPECS", "RewardSet", "RewardSpec", "build_reward", "check_names", "parse_weights", "reward_names"]


class RewardSection(Protocol):
    """What a RewardSet reads of a run's config (config.RewardConfig; the rewards import no config)."""

    weights: dict[str, float]
    paths: dict[str, str]
    batch_size: int
    timeout_s: str
    retries: int
    remote: dict[str, str]


@dataclass(frozen=True)
class RewardSpec:
    name: str
    build: Callable[[RewardContext], Reward]
    description: str
    weights: str = ""  # where the weights come from, for errors and `doctor`; '' = needs none
    extra: str = ""  # the pip extra that installs its backend; '' = core install


def _jpeg(name: str, sign: float, scale: float) -> Callable[[RewardContext], Reward]:
    def build(ctx: RewardContext) -> Reward:
        from solrl_core.rewards.jpeg import JpegSize

        return JpegSize(name, sign=sign, scale=scale)
    return build


def _tinyworld(ctx: RewardContext) -> Reward:
    from solrl_core.rewards.tinyworld import TinyWorldReward

    return TinyWorldReward()


def _imagereward(ctx: RewardContext) -> Reward:
    from solrl_core.rewards.imagereward import ImageRewardScore

    return ImageRewardScore.load(ctx)


def _pickscore(ctx: RewardContext) -> Reward:
    from solrl_core.rewards.clip_rewards import PickScore

    return PickScore.load(ctx)


def _clipscore(ctx: RewardContext) -> Reward:
    from solrl_core.rewards.clip_rewards import ClipScore

    return ClipScore.load(ctx)


def _hpsv2(ctx: RewardContext) -> Reward:
    from solrl_core.rewards.hpsv2 import HPSv2

    return HPSv2.load(ctx)


_BUILDERS: dict[str, Callable[[RewardContext], Reward]] = {
    "jpeg_compressibility": _jpeg("jpeg_compressibility", -1.0, 1 / 500),
    "jpeg_incompressibility": _jpeg("jpeg_incompressibility", 1.0, 1.0),
    "tinyworld_geneval": _tinyworld, "imagereward": _imagereward, "pickscore": _pickscore,
    "clipscore": _clipscore, "hpsv2": _hpsv2,
}
SPECS: dict[str, RewardSpec] = {i.name: RewardSpec(i.name, _BUILDERS[i.name], i.description, i.weights, i.extra)
                                for i in REWARDS}


def reward_names() -> list[str]:
    return list(SPECS)


def build_reward(name: str, ctx: RewardContext | None = None, *, remote: dict[str, str] | None = None,
                 timeout_s: float = 0.0) -> Reward:
    """One reward by name, loaded for `ctx` (CPU, fp32, hub weights when omitted). A remote:URL or
    vlm:URL reward (remote.py, vlm.py) reads the reward.remote settings and limits each request to
    `timeout_s` seconds (0: its default)."""
    if is_endpoint(name):
        from solrl_core.rewards.remote import build_endpoint

        return build_endpoint(name, remote or {}, timeout_s)
    spec = SPECS.get(name)
    if spec is None:
        raise SolrlError(f"unknown reward '{name}'", close_matches(name, reward_names()))
    try:
        return spec.build(ctx or RewardContext())
    except ImportError as exc:
        install = f"pip install 'solrl[{spec.extra}]'" if spec.extra else "pip install solrl"
        raise SolrlError(f"reward '{name}' cannot import its backend ({exc})", f"install it with `{install}`") from exc


@dataclass(frozen=True)
class Scores:
    """Per-image total reward and each component's raw score."""

    total: torch.Tensor
    components: dict[str, torch.Tensor]


class RewardSet:
    """Several rewards with weights. `total` is always the weighted sum of raw scores; how the
    components meet the advantage (sum or per-reward normalisation) is `nft.combined_advantages`.

    Each reward's scoring call runs under the watchdog (watchdog.py): `timeout_s` is the
    reward.timeout_s setting (auto: model rewards only; '0': none), `retries` the tries after an
    error. Retries survived are kept in `retried` for the trainer to report."""

    def __init__(self, weights: dict[str, float], ctx: RewardContext | None = None,
                 paths: dict[str, str] | None = None, *, timeout_s: str = "0", retries: int = 0,
                 remote: dict[str, str] | None = None) -> None:
        check_names(weights, paths or {})
        base = ctx or RewardContext()
        self.weights = dict(weights)
        # A reward behind a URL is watched like a model reward: a server can hang as a model can.
        self.timeouts = {n: timeout_for(timeout_s, model_reward=is_endpoint(n) or bool(SPECS[n].weights)) for n in weights}
        self.rewards = {n: build_reward(n, RewardContext(base.device, base.dtype, (paths or {}).get(n, ""), base.batch_size),
                                        remote=remote, timeout_s=self.timeouts[n])
                        for n in weights}
        self.retries = retries
        self.retried: list[str] = []
        self.stop: Callable[[], bool] | None = None  # true once a stop was asked: a hung call is abandoned (watchdog.py)

    @classmethod
    def from_config(cls, reward: RewardSection, device: torch.device) -> "RewardSet":
        """The rewards of a run's `reward` config section, loaded on `device` in fp32."""
        return cls(reward.weights, RewardContext(device, torch.float32, batch_size=reward.batch_size), paths=reward.paths,
                   timeout_s=reward.timeout_s, retries=reward.retries, remote=reward.remote)

    def check_prompts(self, prompts: list[str]) -> None:
        for reward in self.rewards.values():
            check = getattr(reward, "check_prompts", None)
            if check is not None:
                check(prompts)

    def summary(self, scores: Scores, prompts: list[str]) -> dict[str, float]:
        """Extra named statistics the rewards define, keyed 'reward.statistic' (`prompts`: one per score)."""
        out = {}
        for name, reward in self.rewards.items():
            summarize = getattr(reward, "summary", None)
            if summarize is not None:
                out.update({f"{name}.{k}": v for k, v in summarize(scores.components[name], prompts).items()})
        return out

    def groups(self, prompts: list[str]) -> dict[str, dict[str, list[int]]]:
        """Per reward that defines `groups(prompts)` (the tiny world's kinds of prompt): its named groups
        of images, by index, whose means `summary` reports as 'reward.group'."""
        return {name: reward.groups(prompts) for name, reward in self.rewards.items() if hasattr(reward, "groups")}

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> Scores:
        with charged_to("reward"):
            components = {n: call_watched(n, lambda r=r: r(images, prompts).float().cpu(), self.timeouts[n], self.retries,
                                          self.retried.append, self.stop)
                          for n, r in self.rewards.items()}
        total = sum(self.weights[n] * s for n, s in components.items())
        return Scores(total=total, components=components)  # type: ignore[arg-type]
