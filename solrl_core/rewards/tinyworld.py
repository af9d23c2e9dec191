"""A GenEval-style programmatic reward for the tiny world (`solrl_core.data.tinyworld`).

GenEval scores an image by detecting objects and checking them against the prompt's spec: are the
asked-for objects there, in the right colour, number and position? The tiny world needs no
detector: a 32x32 image of flat shapes on a known background can be read exactly by colour
segmentation. That makes the reward noise-free on ground truth (every rendered caption scores 1.0)
and cheap enough to run on every rollout, so reward changes reflect the policy, not the judge.

Where we differ from GenEval: GenEval marks an image right or wrong; RL needs a denser signal, so
`score` gives partial credit per sub-goal (documented there), and `strict_accuracy`
(rewards/world.py) recovers GenEval's all-or-nothing rate as the share of perfect scores.

Numpy only at run time: the connected-component labelling is a few lines of flood fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Callable

import numpy as np

from solrl_core.data.tinyworld import BACKGROUND, COLORS, WORLD, Spec, relation_holds
from solrl_core.rewards.world import WorldReward

# A pixel belongs to a colour when it lies near the straight RGB segment from the background to
# that colour (blurred or anti-aliased edges are blends along it) and at least half-way along it.
# Measuring distance to the segment rather than to the palette point keeps a blurred yellow edge
# yellow, where the nearest palette point would call it orange.
MAX_DISTANCE = 50.0  # RGB units from the segment; colour noise of std 8 gives about 12
MIN_BLEND = 0.5  # thresholding a blurred shape at half coverage keeps its outline in place
# A real shape covers 61 (triangle) to 89 (circle) pixels at RADIUS=5; fragments and specks of
# a colour smaller than this are not counted as objects.
MIN_AREA = 24
# A region bigger than any one shape may be two same-coloured shapes that blur joined across
# their one- or two-pixel gap: one erosion cuts such a neck, leaving one core per shape.
SPLIT_AREA = 120
MIN_CORE = 10
SQUARE_FILL = 0.85  # share of its bounding box a square fills: 1.0 drawn, 0.95 blurred; circle 0.74
TRIANGLE_TOP_SHARE = 0.65  # top-half / bottom-half area: triangle 0.3 (0.4 blurred), others 1.0

_NAMES = list(COLORS)
_BG = np.array(BACKGROUND, dtype=np.float32)
_DIRS = np.array([COLORS[n] for n in _NAMES], dtype=np.float32) - _BG  # [K, 3]


@dataclass(frozen=True)
class Detected:
    """One object found in an image. x, y: its centre in pixels (see `analyze`)."""

    color: str
    shape: str
    x: float
    y: float
    area: int


def classify_pixels(image: np.ndarray) -> np.ndarray:
    """[H, W] palette index of each pixel of a [H, W, 3] uint8 image, -1 for background/unknown."""
    p = image.astype(np.float32) - _BG  # [H, W, 3]
    blend = np.clip(p @ _DIRS.T / (_DIRS * _DIRS).sum(1), 0.0, 1.0)  # [H, W, K]
    dist = np.linalg.norm(p[..., None, :] - blend[..., None] * _DIRS, axis=-1)  # [H, W, K]
    k = dist.argmin(-1)
    best_blend = np.take_along_axis(blend, k[..., None], -1)[..., 0]
    best_dist = np.take_along_axis(dist, k[..., None], -1)[..., 0]
    return np.where((best_blend >= MIN_BLEND) & (best_dist <= MAX_DISTANCE), k, -1)


def components(labels: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """8-connected regions of equal label >= 0, as (label, ys, xs)."""
    h, w = labels.shape
    seen = np.zeros(labels.shape, dtype=bool)
    out = []
    for y0, x0 in np.argwhere(labels >= 0):
        if seen[y0, x0]:
            continue
        lab, stack, pixels = labels[y0, x0], [(y0, x0)], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            pixels.append((y, x))
            for ny in (y - 1, y, y + 1):
                for nx in (x - 1, x, x + 1):
                    if 0 <= ny < h and 0 <= nx < w and not seen[ny, nx] and labels[ny, nx] == lab:
                        seen[ny, nx] = True
                        stack.append((ny, nx))
        ys, xs = np.array(pixels).T
        out.append((int(lab), ys, xs))
    return out


def split_merged(ys: np.ndarray, xs: np.ndarray, split_area: int = SPLIT_AREA,
                 min_core: int = MIN_CORE) -> list[tuple[np.ndarray, np.ndarray]]:
    """A large region cut into shapes at thin necks: each pixel joins the nearest eroded core."""
    if len(ys) <= split_area:
        return [(ys, xs)]
    y0, x0 = ys.min(), xs.min()
    mask = np.zeros((ys.max() - y0 + 3, xs.max() - x0 + 3), dtype=bool)  # one pixel of margin
    mask[ys - y0 + 1, xs - x0 + 1] = True
    h, w = mask.shape[0] - 2, mask.shape[1] - 2
    core = np.logical_and.reduce([mask[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)])
    cores = [(cy, cx) for _, cy, cx in components(np.where(core, 0, -1)) if len(cy) >= min_core]
    if len(cores) < 2:
        return [(ys, xs)]
    py, px = ys - y0, xs - x0
    dist = np.stack([((py[:, None] - cy) ** 2 + (px[:, None] - cx) ** 2).min(1) for cy, cx in cores])
    owner = dist.argmin(0)
    return [(ys[owner == i], xs[owner == i]) for i in range(len(cores))]


def classify_shape(ys: np.ndarray, xs: np.ndarray) -> str:
    """circle, square or triangle from a component's pixels.

    The world's triangles point up, so far more of their area lies below the middle row of their
    box than above it; this holds under blur and missing pixels, unlike edge-straightness tests.
    Of the two symmetric shapes, a square fills its bounding box and a circle about three quarters;
    the box ignores rows and columns holding a single pixel, so one stray pixel cannot widen it.
    """
    mid = (ys.min() + ys.max()) / 2
    top, bottom = int((ys < mid).sum()), int((ys > mid).sum())
    if top < TRIANGLE_TOP_SHARE * bottom:
        return "triangle"
    rows, cols = _span(ys), _span(xs)
    inside = (ys >= rows[0]) & (ys <= rows[1]) & (xs >= cols[0]) & (xs <= cols[1])
    fill = inside.sum() / ((rows[1] - rows[0] + 1) * (cols[1] - cols[0] + 1))
    return "square" if fill >= SQUARE_FILL else "circle"


def _span(coords: np.ndarray) -> tuple[int, int]:
    """First and last coordinate held by at least two pixels (all of them if none is)."""
    values, counts = np.unique(coords, return_counts=True)
    kept = values[counts >= 2] if (counts >= 2).any() else values
    return int(kept.min()), int(kept.max())


def analyze(image: np.ndarray, min_area: int = MIN_AREA, split_area: int = SPLIT_AREA,
            min_core: int = MIN_CORE) -> list[Detected]:
    """The objects in a [H, W, 3] uint8 image, ordered by position (top to bottom, left to right).
    The size thresholds default to the tiny world's shapes; smaller shapes pass their own.

    The centre is the area centroid, except for triangles, whose centroid lies a sixth of their
    height below the middle of their box: it is moved up to that middle, the point the scene
    placed, so that relations are judged as the caption's layout meant them.
    """
    found = []
    for lab, region_ys, region_xs in components(classify_pixels(image)):
        for ys, xs in split_merged(region_ys, region_xs, split_area, min_core):
            if len(ys) < min_area:
                continue
            shape = classify_shape(ys, xs)
            y = float(ys.mean())
            if shape == "triangle":
                y -= (ys.max() - ys.min() + 1) / 6
            found.append(Detected(_NAMES[lab], shape, float(xs.mean()), y, len(ys)))
    return sorted(found, key=lambda d: (d.y, d.x))


Pair = Callable[[Detected | None, Detected | None], float]


def _best_pair(wanted: tuple[tuple[str, str, int], ...], found: list[Detected], credit: Pair) -> float:
    """Best total `credit(a, b)` over assignments of distinct detections (or None) to two objects."""
    colors = {c for c, _, _ in wanted}
    options: list[Detected | None] = [None, *(d for d in found if d.color in colors)]
    return max(credit(a, b) for a, b in product(options, options) if a is None or a is not b)


def score(spec: Spec, found: list[Detected]) -> float:
    """How well the detected objects meet the spec, in [0, 1]; exactly 1.0 when fully right.

    Partial credit per sub-goal, in the spirit of GenEval's task checks:
      object    "a red circle": 0.5 if any red object exists, + 0.5 if a red one is a circle.
      count     "two blue squares": 0.5 if at least one blue square exists, + 0.5 if there are
                exactly two blue squares.
      binding   "a red circle and a blue square": per requested object 0.5 if a detection has its
                colour and shape, else 0.25 if one has its colour; one detection serves one object.
      position  "a red circle left of a blue square": 0.25 per requested object present with the
                right colour and shape, + 0.5 if `relation_holds` for the two matched centres
                (the best pair when there are several candidates).
    Objects the prompt does not mention are ignored (GenEval's object tasks allow extras).
    """
    if spec.kind in ("object", "count"):
        color, shape, n = spec.objects[0]
        colored = [d for d in found if d.color == color]
        exact = sum(d.shape == shape for d in colored)
        if spec.kind == "object":
            return 0.5 * bool(colored) + 0.5 * bool(exact)
        return 0.5 * bool(exact) + 0.5 * (exact == n)
    (ca, sa, _), (cb, sb, _) = spec.objects

    def ok(d: Detected | None, color: str, shape: str) -> bool:
        return d is not None and d.color == color and d.shape == shape

    if spec.kind == "binding":
        def part(d: Detected | None, color: str, shape: str) -> float:
            return 0.5 if ok(d, color, shape) else 0.25 if d is not None and d.color == color else 0.0
        return _best_pair(spec.objects, found, lambda a, b: part(a, ca, sa) + part(b, cb, sb))

    def placed(a: Detected | None, b: Detected | None) -> float:
        has_a, has_b = ok(a, ca, sa), ok(b, cb, sb)
        if a is None or b is None or not (has_a and has_b):
            return 0.25 * has_a + 0.25 * has_b
        return 0.5 + 0.5 * relation_holds(spec.relation, (a.x, a.y), (b.x, b.y))
    return _best_pair(spec.objects, found, placed)


class TinyWorldReward(WorldReward):
    """`score(parse(prompt), analyze(image))` per image, as a solrl reward; per-kind means of object,
    count, binding and position in its summary."""

    name = "tinyworld_geneval"
    world = WORLD

    def judge(self, spec: Spec, pixels: np.ndarray) -> float:
        return score(spec, analyze(pixels))
