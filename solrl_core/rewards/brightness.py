"""`brightness`: the mean pixel value, a reward made to be gamed.

Nothing about a good image is measured: a policy raises it fastest by washing its images out, which
is the point. It is how a run that hacks its reward looks, on any model in a few minutes: train on
it with the tiny preset and the eval reward `tinyworld_fidelity` falls while it rises, and the
hacking rule (loop/hacking.py) catches it within the run (docs/rewards.md, "A run made to hack").
"""

from __future__ import annotations

import torch


class Brightness:
    """Mean over pixels and channels of images [B, 3, H, W] in [0, 1]."""

    name = "brightness"

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return images.detach().float().clamp(0, 1).mean(dim=tuple(range(1, images.dim()))).cpu()
