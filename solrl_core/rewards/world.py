"""The scoring skeleton of the tiny worlds' GenEval-style rewards, once for images and clips.

A tiny world's reward parses each caption with its world's grammar (`data/world.py`), reads the
pixels of each image or clip and scores them against the spec; what differs between the worlds is
only the reading and the scoring (`judge`): rewards/tinyworld.py for images, rewards/tinyvideo.py
for clips. Every rendered caption scores exactly 1.0 in both, so a change in reward is a change in
the policy, not the judge.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch

from solrl_core.data.world import World
from solrl_core.errors import SolrlError
from solrl_core.io.images import to_uint8


def strict_accuracy(scores: torch.Tensor) -> float:
    """Share of samples scored exactly 1.0: GenEval's all-or-nothing accuracy (0.0 for none)."""
    return float((scores == 1.0).float().mean()) if scores.numel() else 0.0


MAX_SIDE_FACTOR = 8  # a world reward scores images up to 8x its world's side (256 for the tiny world's 32)


class WorldReward(ABC):
    """`judge(parse(prompt), pixels)` per image or clip of `world`, as a solrl reward."""

    name: str
    world: World

    @property
    def max_side(self) -> int:
        """The largest image side this reward scores (limits.reward_side): MAX_SIDE_FACTOR x its world's, so
        the server bounds the per-pixel work of judging (two 2048x2048 images cost 1 GB; 256x256, a few MB)."""
        return MAX_SIDE_FACTOR * self.world.size

    @abstractmethod
    def judge(self, spec: Any, pixels: np.ndarray) -> float:
        """The score in [0, 1] of one uint8 image [H, W, 3] or clip [F, H, W, 3] against its spec."""

    def summary(self, scores: torch.Tensor, prompts: list[str]) -> dict[str, float]:
        """Strict accuracy, and the mean score of each kind of caption present: a gain on one kind
        need not be a gain on the others."""
        out = {"strict_accuracy": strict_accuracy(scores)}
        out.update({kind: float(scores[members].mean()) for kind, members in self.groups(prompts).items()})
        return out

    def groups(self, prompts: list[str]) -> dict[str, list[int]]:
        """The samples of each kind of caption present, by index, in the world's kinds order: the
        per-kind means of `summary`, and what an evaluation pairs to give each kind's change a standard error."""
        kinds = [spec.kind for spec in self._specs(prompts)]
        return {kind: members for kind in self.world.kinds
                if (members := [i for i, k in enumerate(kinds) if k == kind])}

    def check_prompts(self, prompts: list[str]) -> None:
        """Fail before a run starts, naming the first prompt this reward cannot judge."""
        self._specs(prompts)

    def _specs(self, prompts: list[str]) -> list[Any]:
        specs = []
        for i, prompt in enumerate(prompts):
            spec = self.world.parse(prompt)
            if spec is None:
                w = self.world
                raise SolrlError(
                    f"reward '{self.name}' cannot judge prompt {i} ({prompt!r}): it is not a caption of the {w.name}",
                    f"use the built-in '{w.prompt_set('train')}' or '{w.prompt_set('heldout')}' prompt sets, or "
                    f"captions of the {w.name}'s grammar such as " + ", ".join(repr(e) for e in w.examples),
                )
            specs.append(spec)
        return specs

    def __call__(self, samples: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """[B] float32 scores on the CPU for images [B, 3, H, W] or clips [B, F, 3, H, W] in [0, 1]."""
        unit, dims = self.world.unit, 5 if self.world.frames else 4
        if samples.dim() != dims:
            layout = "[B, F, 3, H, W]" if self.world.frames else "[B, 3, H, W]"
            raise ValueError(f"{self.name} judges {unit}s {layout}, not a tensor of shape {tuple(samples.shape)}")
        if len(prompts) != samples.shape[0]:
            raise ValueError(f"{samples.shape[0]} {unit}s but {len(prompts)} prompts")
        specs = self._specs(prompts)  # an unjudgeable prompt is an error, never a silent 0
        scores = [self.judge(spec, pixels) for spec, pixels in zip(specs, to_uint8(samples))]
        return torch.tensor(scores, dtype=torch.float32)
