"""A run's rewards together (`RewardSet`: weights, the watchdog around each call, the same plugin
code on every process) and `build_reward`, which builds one reward as the registry declares it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from solrl_core.errors import SolrlError, close_matches
from solrl_core.faults.phase import charged_to
from solrl_core.rewards.base import Reward, RewardContext
from solrl_core.rewards.endpoints import is_endpoint
from solrl_core.rewards.names import check_names, known_names
from solrl_core.rewards.registry import lookup
from solrl_core.rewards.timeouts import timeout_for
from solrl_core.rewards.watchdog import call_watched


class RewardSection(Protocol):
    """What a RewardSet reads of a run's config (config.RewardConfig; the rewards import no config)."""

    weights: dict[str, float]
    paths: dict[str, str]
    batch_size: int
    timeout_s: str
    retries: int
    remote: dict[str, str]
    video_frames: int
    frame_reduce: str


def reward_names() -> list[str]:
    return known_names()


def build_reward(name: str, ctx: RewardContext | None = None, *, remote: dict[str, str] | None = None,
                 timeout_s: float = 0.0, video_frames: int = 0, frame_reduce: str = "mean") -> Reward:
    """One reward by name, loaded for `ctx` (CPU, fp32, hub weights when omitted): a built-in or a
    plugin (plugins.py) as the registry declares it (rewards/registry.py). A remote:URL or vlm:URL
    reward (remote.py, vlm.py) reads the reward.remote settings and limits each request to
    `timeout_s` seconds (0: its default), and judges a clip on the frames `video_frames` samples, combined by
    `frame_reduce`, as an image reward in process does."""
    if is_endpoint(name):
        from solrl_core.rewards.remote import build_endpoint

        return build_endpoint(name, remote or {}, timeout_s, video_frames, frame_reduce)
    info = lookup(name)
    if info is None:
        raise SolrlError(f"unknown reward '{name}'", close_matches(name, reward_names()) + " (list them with: solrl "
                                                                                           "presets)")
    if info.build is None:
        from solrl_core.rewards.plugins import load_plugin

        return load_plugin(name, ctx)
    try:
        return info.build(ctx or RewardContext())
    except ImportError as exc:
        raise SolrlError(f"reward '{name}' cannot import its backend ({exc})", f"install it: {info.install}") from exc


def _may_hang(name: str) -> bool:
    info = lookup(name)
    return is_endpoint(name) or info is None or info.build is None or info.needs_weights


def same_plugins_on_every_rank(rewards: dict[str, Reward]) -> None:
    """Under --nproc-per-node, every process must score with the same plugin code: each compares
    what its plugins resolved to (plugins.fingerprint) with rank 0's, and all stop together if any differs."""
    from solrl_core.runtime import distributed

    mine = {n: r.fingerprint for n, r in rewards.items() if hasattr(r, "fingerprint")
            and isinstance(r.fingerprint, str)}
    if distributed.world_size() == 1 or not mine:
        return
    first = distributed.broadcast_object(mine)
    differs = sorted(n for n in mine if first.get(n) != mine[n])
    if distributed.any_true(bool(differs)):
        fix = ("install the same version of the plugin for every process (every node), or give its file by an absolute "
               "path")
        if not differs:
            raise SolrlError("a reward plugin is not the same code on every process (another rank names it)", fix)
        name = differs[0]
        raise SolrlError(f"reward plugin '{name}' is not the same code on every process: rank {distributed.rank()} "
                         f"loaded {mine[name]}, rank 0 {first.get(name)}", fix)


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
                 remote: dict[str, str] | None = None, video_frames: int = 0, frame_reduce: str = "mean") -> None:
        check_names(weights, paths or {})
        base = ctx or RewardContext()
        self.weights = dict(weights)
        # A reward behind a URL, or the user's own code, is watched like a model reward: either can hang as a model can.
        self.timeouts = {n: timeout_for(timeout_s, model_reward=_may_hang(n)) for n in weights}
        self.rewards = {n: build_reward(n,
                RewardContext(base.device, base.dtype, (paths or {}).get(n, ""), base.batch_size),
                                        remote=remote, timeout_s=self.timeouts[n],
                                        video_frames=video_frames, frame_reduce=frame_reduce)
                        for n in weights}
        same_plugins_on_every_rank(self.rewards)
        self.retries = retries
        # On clips [B, F, 3, H, W]: which rewards judge them whole (media "video"; an endpoint is sent the clips and
        # samples their frames as video_frames says, and says what it judges once connected); the others score frames
        # (video.py).
        self.endpoints = {n: tuple(getattr(r, "media", ("image",))) for n, r in self.rewards.items() if is_endpoint(n)}
        self.judges_clips = {n for n in weights if (info := lookup(n)) is not None and info.media
                             == "video"} | set(self.endpoints)
        self.video_frames, self.frame_reduce = video_frames, frame_reduce
        self.retried: list[str] = []
        # true once a stop was asked: a hung call is abandoned (watchdog.py)
        self.stop: Callable[[], bool] | None = None

    @classmethod
    def from_config(cls, reward: RewardSection, device: torch.device) -> "RewardSet":
        """The rewards of a run's `reward` config section, loaded on `device` in fp32."""
        return cls(reward.weights, RewardContext(device, torch.float32, batch_size=reward.batch_size),
                   paths=reward.paths,
                   timeout_s=reward.timeout_s, retries=reward.retries, remote=reward.remote,
                   video_frames=reward.video_frames, frame_reduce=reward.frame_reduce)

    def probe_plugins(self, prompts: list[str], size: int, device: torch.device) -> None:
        """Each plugin called once on a probe batch (plugins.PluginReward.probe), before a run loads its model."""
        from solrl_core.rewards.plugins import PluginReward

        for reward in self.rewards.values():
            if isinstance(reward, PluginReward):
                reward.probe(prompts, size, device)

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

    def _scorer(self, name: str, reward: Reward, images: torch.Tensor, prompts: list[str],
                frames: tuple[int, str]) -> Callable[[], torch.Tensor]:
        """One reward's call on `images`: an image reward on clips [B, F, 3, H, W] scores their frames (video.py);
        an endpoint is sent the clips, after it is checked to judge what it is sent."""
        if name in self.endpoints:
            from solrl_core.rewards.endpoints import check_media

            check_media(name, self.endpoints[name], video=images.dim() == 5)
        if images.dim() == 5 and name not in self.judges_clips:
            from solrl_core.rewards.video import score_frames

            return lambda: score_frames(reward, images, prompts, *frames)
        return lambda: reward(images, prompts).float().cpu()

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str], video_frames: int | None = None,
                 frame_reduce: str = "") -> Scores:
        """Scores of images [B, 3, H, W], or of a video model's clips [B, F, 3, H, W] (`video_frames`,
        `frame_reduce`: this call's frame sampling and combination, as a reward server's request names
        them; None and '' = the set's)."""
        frames = (self.video_frames if video_frames is None else video_frames, frame_reduce or self.frame_reduce)
        with charged_to("reward"):
            components = {n: call_watched(n, self._scorer(n, r, images, prompts, frames), self.timeouts[n],
                                          self.retries,
                                          self.retried.append, self.stop)
                          for n, r in self.rewards.items()}
        total = sum(self.weights[n] * s for n, s in components.items())
        return Scores(total=total, components=components)  # type: ignore[arg-type]
