"""`tinyvideo_geneval`: a GenEval-style programmatic reward for the tiny moving world (`solrl_core.data.tinyvideo`).

A video reward (registry.py declares it so): it judges whole clips [B, F, 3, H, W]. Each frame is read
as the tiny world's reward reads an image (rewards/tinyworld.py: colour segmentation, connected
regions, shape from fill and top/bottom balance), with size thresholds for the moving world's smaller
shapes; the shapes of the asked-for colour are then followed from the first frame to the last. Every
rendered caption scores exactly 1.0, so a change in reward is a change in the policy, not the judge.

Partial credit per sub-goal (a clip scores in [0, 1]):
  motion  "a red circle moving to the left": 0.25 if a red shape is in every frame, + 0.25 if a red
          shape is a circle in the frame where red covers most pixels, + 0.5 if the red shapes' motion
          (below) is the asked-for one.
  count   "two blue squares moving up": 0.25 if a blue square is there (in that frame), + 0.25 if every
          frame holds exactly two blue shapes, + 0.5 for the motion.
Motion: the mean centre and the total area of the colour's shapes, first frame against last. A move
of at least MOVE_MIN pixels is left, right, up or down by its larger axis (each true move is 6 pixels);
else an area ratio of at least GROW_RATIO is growing, at most its inverse shrinking (true ratios 4 to
9); else still. Shapes of other colours are ignored, as GenEval's object tasks allow extras.
"""

from __future__ import annotations

import numpy as np

from solrl_core.data.tinyvideo import WORLD, Spec
from solrl_core.rewards.tinyworld import Detected, analyze
from solrl_core.rewards.world import WorldReward

# The smallest shape drawn is a square of radius 2 (3x3 pixels); two shapes of radius 3 that blur
# together cover at least 50 pixels, the largest single shape (a circle of radius 5) 89, which erosion
# leaves as one core and so is never cut.
MIN_AREA, SPLIT_AREA, MIN_CORE = 6, 40, 4
MOVE_MIN = 3.0  # pixels, first frame to last
GROW_RATIO = 1.8  # area, last frame over first


def read_clip(clip: np.ndarray) -> list[list[Detected]]:
    """The shapes found in each frame of a [F, H, W, 3] uint8 clip."""
    return [analyze(frame, MIN_AREA, SPLIT_AREA, MIN_CORE) for frame in clip]


def motion_of(first: list[Detected], last: list[Detected]) -> str:
    """left, right, up, down, grow, shrink or still: how a group of shapes changed between two frames."""
    if not first or not last:
        return "still"
    dx = np.mean([d.x for d in last]) - np.mean([d.x for d in first])
    dy = np.mean([d.y for d in last]) - np.mean([d.y for d in first])
    if max(abs(dx), abs(dy)) >= MOVE_MIN:
        return ("right" if dx > 0 else "left") if abs(dx) >= abs(dy) else ("down" if dy > 0 else "up")
    ratio = sum(d.area for d in last) / sum(d.area for d in first)
    return "grow" if ratio >= GROW_RATIO else "shrink" if ratio <= 1 / GROW_RATIO else "still"


def score(spec: Spec, frames: list[list[Detected]]) -> float:
    """How well the shapes found in a clip's frames meet the spec, in [0, 1] (the module docstring)."""
    mine = [[d for d in found if d.color == spec.color] for found in frames]
    peak = max(range(len(mine)), key=lambda f: sum(d.area for d in mine[f]))
    shaped = any(d.shape == spec.shape for d in mine[peak])
    moved = motion_of(mine[0], mine[-1]) == spec.motion
    if spec.kind == "count":
        exact = all(len(m) == spec.count for m in mine)
        return 0.25 * shaped + 0.25 * exact + 0.5 * moved
    present = all(mine)
    return 0.25 * present + 0.25 * (present and shaped) + 0.5 * (present and moved)


class TinyVideoReward(WorldReward):
    """`score(parse(prompt), read_clip(clip))` per clip, as a solrl video reward; per-kind means of
    motion and count in its summary."""

    name = "tinyvideo_geneval"
    world = WORLD

    def judge(self, spec: Spec, pixels: np.ndarray) -> float:
        return score(spec, read_clip(pixels))
