"""The flat paint the synthetic worlds are drawn in: colours, shapes and how a shape is drawn.

Shared by the tiny world (`tinyworld.py`, still 32x32 scenes) and the tiny moving world
(`tinyvideo.py`, short 16x16 clips), and read by their rewards (`rewards/tinyworld.py` segments by
these colours). Numpy only.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

BACKGROUND = (24, 24, 28)
COLORS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 90, 230),
    "yellow": (235, 215, 40),
    "purple": (160, 70, 210),
    "orange": (245, 140, 30),
}
SHAPES = ("circle", "square", "triangle")

# (colour, shape, centre x, centre y, radius): radius is half the side of the shape's bounding box
Stroke = tuple[str, str, int, int, int]


def shape_mask(shape: str, x: int, y: int, radius: int, size: int) -> np.ndarray:
    """[size, size] bool mask of one shape centred at (x, y) (image y grows downward)."""
    yy, xx = np.mgrid[0:size, 0:size]
    dx, dy = xx - x, yy - y
    if shape == "circle":
        return dx * dx + dy * dy <= radius * radius + 1
    if shape == "square":
        return (np.abs(dx) <= radius - 1) & (np.abs(dy) <= radius - 1)
    # upward triangle: apex at the top, base at the bottom of the box
    return (dy >= -radius) & (dy <= radius) & (np.abs(dx) * 2 <= (dy + radius))


def paint(strokes: Iterable[Stroke], size: int) -> np.ndarray:
    """[size, size, 3] uint8 image of the shapes on the background, later ones over earlier ones."""
    img = np.empty((size, size, 3), dtype=np.uint8)
    img[:] = BACKGROUND
    for color, shape, x, y, radius in strokes:
        img[shape_mask(shape, x, y, radius, size)] = COLORS[color]
    return img
