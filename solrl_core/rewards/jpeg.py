"""JPEG file size as a reward (DDPO's compressibility task): needs no model weights."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] floats in [0, 1] -> [B, H, W, 3] uint8."""
    arr = images.detach().float().clamp(0, 1).mul_(255).round_().to(torch.uint8)  # one float copy, not three
    return arr.permute(0, 2, 3, 1).cpu().numpy()


class JpegSize:
    """sign * scale * (size in KB of the image saved as JPEG, quality 95)."""

    def __init__(self, name: str, sign: float, scale: float) -> None:
        self.name, self.sign, self.scale = name, sign, scale

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        sizes = []
        for arr in to_uint8(images):
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format="JPEG", quality=95)
            sizes.append(buf.tell() / 1000.0)
        return self.sign * self.scale * torch.tensor(sizes, dtype=torch.float32)
