"""The tiny moving world: the video twin of the tiny world, small enough to train and align on a CPU.

Clips are FRAMES frames of SIZE x SIZE RGB, drawn in the tiny world's paint (shapes.py): one or two
coloured shapes that move across the frames. Captions come from a small grammar:

    motion   "a red circle moving to the left", "a blue square growing"
    count    "two green triangles moving up"

A shape moves left, right, up or down by STEP pixels a frame, or stays put and grows or shrinks by one
pixel of radius a frame. Two shapes of a count caption move together (left, right, up, down only: two
growing shapes do not fit a 16-pixel frame).

Every clip is a pure function of its seed. Held out: one motion per colour (red moving left, green
moving right, blue moving up, yellow moving down, purple growing, orange shrinking). A caption with a
held-out (colour, motion) pair is never seen in pre-training or RL training, so a rise on those
captions is composition the model was never shown, not memorisation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from solrl_core.data.shapes import COLORS, SHAPES, paint
from solrl_core.data.tinyworld import article
from solrl_core.data.world import World, caption_matches

SIZE = 16  # frame side, pixels
FRAMES = 4
RADIUS = 3  # half the box side of a moving shape; a growing one goes 2, 3, 4, 5 (shrinking: the reverse)
STEP = 2  # pixels a moving shape travels per frame
MOTIONS = {
    "left": "moving to the left",
    "right": "moving to the right",
    "up": "moving up",
    "down": "moving down",
    "grow": "growing",
    "shrink": "shrinking",
}
TRANSLATIONS = ("left", "right", "up", "down")
VELOCITY = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # image y grows downward
KINDS = ("motion", "count")
# One motion per colour is held out: each colour is still seen with five motions, each motion with five colours.
HELDOUT_PAIRS = frozenset(zip(COLORS, MOTIONS))
VOCAB = tuple(sorted({"a", "an", "two", *COLORS, *SHAPES, *(s + "s" for s in SHAPES),
                      *(w for phrase in MOTIONS.values() for w in phrase.split())}))


@dataclass(frozen=True)
class Spec:
    """What a caption asks for: one group of `count` shapes of one colour and shape, and their motion."""

    kind: str
    color: str
    shape: str
    motion: str
    count: int = 1

    @property
    def heldout(self) -> bool:
        return (self.color, self.motion) in HELDOUT_PAIRS


def describe(spec: Spec) -> str:
    """The caption of a spec (the inverse of parse)."""
    if spec.kind == "count":
        return f"two {spec.color} {spec.shape}s {MOTIONS[spec.motion]}"
    return f"{article(spec.color)} {spec.color} {spec.shape} {MOTIONS[spec.motion]}"


_PHRASE = {phrase: motion for motion, phrase in MOTIONS.items()}
_MOTION = "|".join(MOTIONS.values())
_PATTERNS = (
    ("count", re.compile(rf"^two (\w+) (\w+?)s ({_MOTION})$")),
    ("motion", re.compile(rf"^an? (\w+) (\w+) ({_MOTION})$")),
)


def parse(prompt: str) -> Spec | None:
    """The spec a caption asks for, or None when it is not a sentence of this world's grammar."""
    for kind, (color, shape, phrase) in caption_matches(prompt, _PATTERNS):
        if color in COLORS and shape in SHAPES:
            motion = _PHRASE[phrase]
            if kind == "count" and motion not in TRANSLATIONS:
                return None
            return Spec(kind, color, shape, motion, 2 if kind == "count" else 1)
    return None


def every_spec() -> list[Spec]:
    """Every caption of the grammar, by kind (motion, then count), colour, shape and motion."""
    specs = [Spec("motion", c, s, m) for c in COLORS for s in SHAPES for m in MOTIONS]
    return specs + [Spec("count", c, s, m, 2) for c in COLORS for s in SHAPES for m in TRANSLATIONS]


def prompts(split: str) -> list[str]:
    """Every caption of one split ('train' or 'heldout'), motion kind first."""
    return [describe(s) for s in every_spec() if s.heldout == (split == "heldout")]


def sample_spec(rng: np.random.Generator, split: str = "train") -> Spec:
    """A random spec of `split`: each kind equally often, then its colour, shape and motion uniformly."""
    kind = KINDS[rng.integers(len(KINDS))]
    motions = tuple(MOTIONS) if kind == "motion" else TRANSLATIONS
    while True:
        spec = Spec(kind, list(COLORS)[rng.integers(len(COLORS))], SHAPES[rng.integers(len(SHAPES))],
                    motions[rng.integers(len(motions))], 2 if kind == "count" else 1)
        if spec.heldout == (split == "heldout"):
            return spec


def radii(motion: str) -> list[int]:
    """A shape's radius in each frame."""
    if motion == "grow":
        return [2 + t for t in range(FRAMES)]
    if motion == "shrink":
        return [2 + FRAMES - 1 - t for t in range(FRAMES)]
    return [RADIUS] * FRAMES


def track(x: int, y: int, motion: str) -> list[tuple[int, int]]:
    """A shape's centre in each frame, starting at (x, y)."""
    vx, vy = VELOCITY.get(motion, (0, 0))
    return [(x + vx * STEP * t, y + vy * STEP * t) for t in range(FRAMES)]


def layout(spec: Spec, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Start centres of the spec's shapes, inside the frame in every frame and apart from each other."""
    r = max(radii(spec.motion))
    offsets = track(0, 0, spec.motion)
    ranges = [(r - min(o[axis] for o in offsets), SIZE - 1 - r - max(o[axis] for o in offsets)) for axis in (0, 1)]
    for _ in range(1000):
        starts = [(int(rng.integers(ranges[0][0], ranges[0][1] + 1)), int(rng.integers(ranges[1][0], ranges[1][1] + 1)))
                  for _ in range(spec.count)]
        # shapes moving together keep their distance: apart in the first frame is apart in every frame
        if all(abs(a[0] - b[0]) >= 2 * r + 2 or abs(a[1] - b[1]) >= 2 * r + 2 for i, a in enumerate(starts)
               for b in starts[i + 1:]):
            return starts
    raise RuntimeError(f"could not lay out {spec}")


def render(spec: Spec, starts: list[tuple[int, int]]) -> np.ndarray:
    """[FRAMES, SIZE, SIZE, 3] uint8 clip of the spec's shapes moving from `starts`."""
    paths = [track(x, y, spec.motion) for x, y in starts]
    rs = radii(spec.motion)
    return np.stack([paint(((spec.color, spec.shape, *p[t], rs[t]) for p in paths), SIZE) for t in range(FRAMES)])


def draw(spec: Spec, rng: np.random.Generator) -> np.ndarray:
    """[FRAMES, SIZE, SIZE, 3] uint8 clip of a spec, its shapes started where `rng` lays them out."""
    return render(spec, layout(spec, rng))


WORLD = World(
    name="tiny moving world", size=SIZE, frames=FRAMES, kinds=KINDS, vocab=VOCAB, prompt_sets="tinyvideo",
    examples=("a red circle moving to the left", "a blue square growing", "two green triangles moving up"),
    sample_spec=sample_spec, describe=describe, parse=parse, draw=draw,
)
example = WORLD.example  # (caption, clip) of one scene, a pure function of the seed
