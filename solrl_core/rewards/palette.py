"""`tinyworld_fidelity`: how much of a tiny-world image is painted in the tiny world's own colours.

A second, independent score for the tiny world, scored at evaluation beside the GenEval-style
reward (`run.eval_rewards`). Every tiny-world scene is flat paint: the dark background and the six
shape colours of `solrl_core.data.tinyworld`, nothing else. For each pixel, d is the Euclidean RGB
distance (0-255 units) to the nearest of those seven colours; the pixel scores
max(0, 1 - d / TOLERANCE), and the image scores the mean over its pixels, in [0, 1]. A rendered
scene scores 1.0; the pre-trained model's smooth edges and slight colour noise score a little lower.

Why a degraded image scores lower: washed-out or brightened backgrounds, colour casts, noise,
speckle and blur all move pixels off the palette, and each pixel more than TOLERANCE away scores 0.
It reads neither the caption nor the layout (where the GenEval-style reward reads only objects,
colours, counts and positions after thresholding, blind to everything between them), so a policy that
raises the trained reward by degrading the paint shows here. Torch only, a few microseconds an image.
"""

from __future__ import annotations

import torch

from solrl_core.data.tinyworld import BACKGROUND, COLORS

TOLERANCE = 64.0  # RGB units: a pixel a quarter of the scale from every paint colour scores 0
PALETTE = torch.tensor([BACKGROUND, *COLORS.values()], dtype=torch.float32)  # [7, 3]


class PaletteFidelity:
    """Mean over pixels of max(0, 1 - (RGB distance to the nearest tiny-world colour) / TOLERANCE)."""

    name = "tinyworld_fidelity"

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        rgb = images.detach().float().clamp(0, 1).cpu() * 255  # [B, 3, H, W]
        palette = PALETTE[None, :, :, None, None]  # [1, 7, 3, 1, 1]
        nearest = (rgb[:, None] - palette).square().sum(dim=2).sqrt().min(dim=1).values  # [B, H, W]
        return (1 - nearest / TOLERANCE).clamp(min=0).mean(dim=(1, 2))
