"""Image preprocessing for model rewards, on tensors and on the reward's device (no PIL round trip).

CLIP-family processors resize the shorter side with bicubic filtering (the longer side rounded
down, as PIL/torchvision processors do), centre-crop, and normalise; `resize_crop_normalize` does
the same on a [B, 3, H, W] batch in [0, 1]. torch's antialiased bicubic is PIL's filter (a = -0.5)
when shrinking and enlarging; the result differs from the processors' uint8 pipeline only by
rounding (tests compare the two)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def resize_crop_normalize(images: torch.Tensor, size: int, crop: int | None = None,
                          mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD) -> torch.Tensor:
    """Shorter side -> `size` (bicubic, antialiased), centre crop to `crop` (default `size`), normalise."""
    crop = crop or size
    x = images.float().clamp(0, 1)
    h, w = x.shape[-2:]
    short, long = min(h, w), max(h, w)
    new_long = int(size * long / short)
    nh, nw = (size, new_long) if h <= w else (new_long, size)
    if (nh, nw) != (h, w):
        x = F.interpolate(x, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True)
    top, left = (nh - crop) // 2, (nw - crop) // 2
    x = x[..., top:top + crop, left:left + crop].clamp(0, 1)
    m = torch.tensor(mean, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    s = torch.tensor(std, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x - m) / s


def score_in_batches(images: torch.Tensor, prompts: list[str], batch_size: int,
                     score: Callable[[torch.Tensor, list[str]], torch.Tensor]) -> torch.Tensor:
    """`score` over chunks of `batch_size` (image, prompt) pairs, as one float32 CPU tensor [B]."""
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    out = [score(images[i:i + batch_size], prompts[i:i + batch_size]).float().cpu()
           for i in range(0, len(prompts), batch_size)]
    return torch.cat(out) if out else torch.zeros(0)
