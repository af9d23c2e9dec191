"""A synthetic text-to-image world small enough to train and align on a CPU.

Images are 32x32 RGB: one to three coloured shapes (circle, square, triangle) on a dark
background. Captions come from a small grammar covering what GenEval-style benchmarks test:

    object     "a red circle"
    count      "three blue squares"
    binding    "a red circle and a blue square"
    position   "a green triangle left of a yellow circle"

Every scene is a pure function of its seed. Two-object prompts (binding, position) are split by
their object pair into a train set and a held-out set; held-out pairs never appear in
pre-training or RL training, so a rise on them is generalisation, not memorisation.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

# The paint is shared with the tiny moving world (shapes.py); BACKGROUND is re-exported for this world's readers.
from solrl_core.data.shapes import BACKGROUND, COLORS, SHAPES, paint  # noqa: F401
from solrl_core.data.world import World, caption_matches

SIZE = 32
COUNTS = {"one": 1, "two": 2, "three": 3}
RELATIONS = ("left of", "right of", "above", "below")
KINDS = ("object", "count", "binding", "position")
RADIUS = 5  # half the side of a shape's bounding box, in pixels
VOCAB = tuple(sorted({"a", "an", "and", "of", "left", "right", "above", "below", *COLORS, *SHAPES,
                      *(s + "s" for s in SHAPES), *COUNTS}))


@dataclass(frozen=True)
class Obj:
    color: str
    shape: str
    x: int  # centre, pixels
    y: int


@dataclass(frozen=True)
class Spec:
    """What a prompt asks for: objects as (color, shape, count), and an optional relation."""

    kind: str
    objects: tuple[tuple[str, str, int], ...]
    relation: str = ""


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def describe(spec: Spec) -> str:
    """The caption of a spec (the inverse of parse)."""
    if spec.kind == "count":
        color, shape, n = spec.objects[0]
        word = {v: k for k, v in COUNTS.items()}[n]
        return f"{word} {color} {shape}s"
    phrases = [f"{article(c)} {c} {s}" for c, s, _ in spec.objects]
    if spec.kind == "object":
        return phrases[0]
    if spec.kind == "binding":
        return f"{phrases[0]} and {phrases[1]}"
    return f"{phrases[0]} {spec.relation} {phrases[1]}"


_OBJ = r"an? (\w+) (\w+)"
_PATTERNS = (
    ("position", re.compile(rf"^{_OBJ} (left of|right of|above|below) {_OBJ}$")),
    ("binding", re.compile(rf"^{_OBJ} and {_OBJ}$")),
    ("count", re.compile(r"^(one|two|three) (\w+) (\w+?)s?$")),
    ("object", re.compile(rf"^{_OBJ}$")),
)


def parse(prompt: str) -> Spec | None:
    """The spec a caption asks for, or None when it is not a sentence of this world's grammar."""
    for kind, g in caption_matches(prompt, _PATTERNS):
        if kind == "position":
            objs, rel = ((g[0], g[1], 1), (g[3], g[4], 1)), g[2]
        elif kind == "binding":
            objs, rel = ((g[0], g[1], 1), (g[2], g[3], 1)), ""
        elif kind == "count":
            objs, rel = ((g[1], g[2], COUNTS[g[0]]),), ""
        else:
            objs, rel = ((g[0], g[1], 1),), ""
        if all(c in COLORS and s in SHAPES for c, s, _ in objs):
            return Spec(kind, objs, rel)
    return None


def _pair_is_heldout(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """About one pair in five is held out, decided by a stable hash of the unordered pair."""
    key = "|".join(sorted([" ".join(a), " ".join(b)]))
    return hashlib.sha256(key.encode()).digest()[0] % 5 == 0


def sample_spec(rng: np.random.Generator, split: str = "train") -> Spec:
    """A random prompt spec; two-object specs are drawn only from `split`'s object pairs."""
    kind = KINDS[rng.integers(len(KINDS))]
    if kind in ("object", "count"):
        color, shape = _pick(rng)
        n = 1 if kind == "object" else int(rng.integers(2, 4))
        return Spec(kind, ((color, shape, n),))
    while True:
        a, b = _pick(rng), _pick(rng)
        if a != b and _pair_is_heldout(a, b) == (split == "heldout"):
            rel = RELATIONS[rng.integers(len(RELATIONS))] if kind == "position" else ""
            return Spec(kind, ((*a, 1), (*b, 1)), rel)


def _pick(rng: np.random.Generator) -> tuple[str, str]:
    names = list(COLORS)
    return names[rng.integers(len(names))], SHAPES[rng.integers(len(SHAPES))]


def layout(spec: Spec, rng: np.random.Generator) -> list[Obj]:
    """Place the spec's objects without overlap, honouring its relation."""
    wanted = [(c, s) for c, s, n in spec.objects for _ in range(n)]
    lo, hi = RADIUS + 1, SIZE - RADIUS - 2
    for _ in range(1000):
        pts = [(int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1))) for _ in wanted]
        if any(abs(p[0] - q[0]) < 2 * RADIUS + 2 and abs(p[1] - q[1]) < 2 * RADIUS + 2
               for i, p in enumerate(pts) for q in pts[i + 1:]):
            continue
        if spec.relation and not relation_holds(spec.relation, pts[0], pts[1]):
            continue
        return [Obj(c, s, x, y) for (c, s), (x, y) in zip(wanted, pts)]
    raise RuntimeError(f"could not lay out {spec}")


def relation_holds(relation: str, a: tuple[float, float], b: tuple[float, float], margin: float = 3.0) -> bool:
    """Whether centre a stands `relation` centre b (image y grows downward)."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    return {"left of": dx > margin, "right of": -dx > margin, "above": dy > margin, "below": -dy > margin}[relation]


def render(objs: list[Obj]) -> np.ndarray:
    """[32, 32, 3] uint8 image of the objects on the background."""
    return paint(((o.color, o.shape, o.x, o.y, RADIUS) for o in objs), SIZE)


def prompt_set(split: str, count: int, seed: int = 1234) -> list[str]:
    """A fixed list of distinct prompts of one split, balanced over the four kinds."""
    # Single-object prompts are all seen in pre-training: only object pairs can be held out.
    kinds = KINDS if split == "train" else ("binding", "position")
    return _draw(split, {k: -(-count // len(kinds)) for k in kinds}, count, seed)


# The default run's training prompts (presets/prompts/tinyworld_rl.txt, the tiny preset's run.prompts):
# 64 captions of the train split, shared by room to rise. Object sits at its ceiling after pre-training
# and gets none; count, which a balanced set (tinyworld_train) moved by only 1.3 standard errors in 30
# iterations, gets half; binding and position a quarter each, the same captions as tinyworld_train's
# (docs/BENCHMARKS.md, "Training prompts weighted to count").
RL_MIX = {"count": 32, "binding": 16, "position": 16}


def rl_prompts(seed: int = 1234) -> list[str]:
    """The default run's training prompts: RL_MIX[kind] distinct train-split captions of each kind."""
    return _draw("train", RL_MIX, sum(RL_MIX.values()), seed)


def _draw(split: str, caps: dict[str, int], count: int, seed: int) -> list[str]:
    """`count` distinct captions of `split` in the order a seeded draw meets them, at most caps[kind]
    of each kind (a kind not in caps: none)."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    seen: set[str] = set()
    per_kind = {k: 0 for k in KINDS}
    for _ in range(200_000):
        if len(out) == count:
            return out
        spec = sample_spec(rng, split)
        text = describe(spec)
        if text in seen or per_kind[spec.kind] >= caps.get(spec.kind, 0):
            continue
        seen.add(text)
        per_kind[spec.kind] += 1
        out.append(text)
    raise ValueError(f"the {split} split has fewer than {count} distinct prompts at {caps}")


def every_heldout_prompt() -> list[str]:
    """Every caption the grammar has on held-out pairs (each binding order, each relation), after
    every single-object caption (object, count: all seen in pre-training, as no single object can be
    held out): the whole evaluation world, by kind."""
    objects = [(c, s) for c in COLORS for s in SHAPES]
    pairs = [(a, b) for a in objects for b in objects if a != b and _pair_is_heldout(a, b)]
    specs = [Spec("object", ((c, s, 1),)) for c, s in objects]
    specs += [Spec("count", ((c, s, n),)) for c, s in objects for n in (2, 3)]
    specs += [Spec("binding", ((*a, 1), (*b, 1))) for a, b in pairs]
    specs += [Spec("position", ((*a, 1), (*b, 1)), rel) for a, b in pairs for rel in RELATIONS]
    return [describe(spec) for spec in specs]


# How many times `evaluation_prompts` lists each caption of a kind (0.5 would keep every second caption,
# listed once): at 3 seeds a listing, the images each kind's change after the default run needs to stand
# more than two paired standard errors clear (docs/BENCHMARKS.md, "Training prompts weighted to count").
# With the default run training on count most (RL_MIX), count's change is the largest and position's,
# with the widest spread, the closest call: every position caption, four listings of each count caption
# and three of each binding caption. Object sits at its ceiling and is only watched for a fall.
EVAL_LISTINGS = {"object": 1, "count": 4, "binding": 3, "position": 1}


def evaluation_prompts() -> list[str]:
    """The default run's evaluation set: the captions of `every_heldout_prompt`, each listed
    EVAL_LISTINGS[kind] times in a row (each listing gets seeds of its own; a fraction keeps every
    1/fraction-th caption of the kind, listed once), so that at 3 seeds a listing the run scores
    1284 images rather than 244 x 8 = 1952 and every kind's change has the standard error it needs."""
    out, seen = [], {kind: 0 for kind in EVAL_LISTINGS}
    for text in every_heldout_prompt():
        kind = parse(text).kind
        listings, seen[kind] = EVAL_LISTINGS[kind], seen[kind] + 1
        if listings >= 1:
            out += [text] * int(listings)
        elif (seen[kind] - 1) % round(1 / listings) == 0:
            out.append(text)
    return out


def validation_prompts(per_kind: int = 32, seed: int = 4321) -> list[str]:
    """Prompts to choose settings on without touching a held-out pair: every single-object caption
    (object, count; no single object can be held out, so these are the evaluation world's own), then
    `per_kind` binding and `per_kind` position captions on *train* pairs that are not in the built-in
    training prompts (`prompt_set('train', 64)`, `rl_prompts()`): captions a run does not train on,
    pairs it may."""
    trained = set(prompt_set("train", 64)) | set(rl_prompts())
    objects = [(c, s) for c in COLORS for s in SHAPES]
    out = [describe(Spec("object", ((c, s, 1),))) for c, s in objects]
    out += [describe(Spec("count", ((c, s, n),))) for c, s in objects for n in (2, 3)]
    rng = np.random.default_rng(seed)
    taken = {"binding": 0, "position": 0}
    while min(taken.values()) < per_kind:
        spec = sample_spec(rng, "train")
        text = describe(spec)
        if spec.kind in taken and taken[spec.kind] < per_kind and text not in trained and text not in out:
            taken[spec.kind] += 1
            out.append(text)
    return out


def draw(spec: Spec, rng: np.random.Generator) -> np.ndarray:
    """[32, 32, 3] uint8 image of a spec, laid out by `rng`."""
    return render(layout(spec, rng))


WORLD = World(
    name="tiny world", size=SIZE, frames=0, kinds=KINDS, vocab=VOCAB, prompt_sets="tinyworld",
    examples=("a red circle", "two blue squares", "a red circle and a blue square", "a green triangle left of a yellow "
                                                                                    "circle"),
    sample_spec=sample_spec, describe=describe, parse=parse, draw=draw,
)
example = WORLD.example  # (caption, image) of one scene, a pure function of the seed
