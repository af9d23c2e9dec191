"""What a tiny world is, once for both: the image world (tinyworld.py) and the clip world (tinyvideo.py).

A world is a grammar (specs drawn from a seeded generator, a caption per spec, the parser back) and a
painter (the pixels of a spec). Each world module declares its `WORLD`; what is done with a world is
written here once, with the world as a parameter: its seeded examples, the built-in prompt sets'
names, the caption normalisation its parser starts from. Its reward (rewards/world.py), its model
(models/tiny.py) and its pre-training (scripts/pretrain_tiny.py) read the same value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class World:
    name: str  # how messages name it: "tiny world", "tiny moving world"
    size: int  # image or frame side, pixels
    frames: int  # frames of a clip; 0 for an image world, as model.frames
    kinds: tuple[str, ...]  # caption kinds, in the order summaries list them
    vocab: tuple[str, ...]  # every word of its captions
    prompt_sets: str  # the built-in prompt sets are PROMPT_SETS_train and PROMPT_SETS_heldout
    examples: tuple[str, ...]  # captions a message shows as examples of the grammar
    sample_spec: Callable[[np.random.Generator, str], Any]  # (rng, split) -> spec
    describe: Callable[[Any], str]  # spec -> caption
    parse: Callable[[str], Any]  # caption -> spec, or None outside the grammar
    draw: Callable[[Any, np.random.Generator], np.ndarray]  # (spec, rng) -> uint8 [(F,) H, W, 3]

    @property
    def unit(self) -> str:
        """What one sample is: an image or a clip."""
        return "clip" if self.frames else "image"

    def example(self, seed: int, split: str = "train") -> tuple[str, np.ndarray]:
        """(caption, pixels) of one scene, a pure function of the seed: its spec and then its layout
        are drawn from one generator seeded with `seed`."""
        rng = np.random.default_rng(seed)
        spec = self.sample_spec(rng, split)
        return self.describe(spec), self.draw(spec, rng)

    def prompt_set(self, split: str) -> str:
        """The name of the built-in prompt set of one split ('train' or 'heldout')."""
        return f"{self.prompt_sets}_{split}"


def caption_matches(prompt: str,
                    patterns: tuple[tuple[str, re.Pattern[str]], ...]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(kind, groups) of each pattern the caption matches, in order, after the normalisation both
    grammars read: lower case, no trailing full stop, single spaces."""
    text = " ".join(prompt.lower().strip().rstrip(".").split())
    for kind, pattern in patterns:
        m = pattern.match(text)
        if m:
            yield kind, m.groups()
