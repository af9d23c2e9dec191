"""JPEG file size as a reward (DDPO's compressibility task): needs no model weights."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from solrl_core.io.images import to_uint8


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
