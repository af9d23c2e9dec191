"""The picture each evaluation of a training run leaves in its folder: the base model's images beside
the evaluated weights' on a few fixed (prompt, seed) pairs of the evaluation set, from the same noise,
each captioned with its reward ('reward 0.5 -> 1.0': the base image's, then the tuned one's; a video
model's clips as contact sheets of their frames).

The images are the evaluation's own: nothing is generated for a picture, but the base column of a
resumed run, whose base evaluation ran in an earlier process (a handful of images, regenerated from
the same seeds). `RUN/pictures/eval_NNNNNN.png`, NNNNNN the iteration (000000: the base alone).
"""

from __future__ import annotations

from pathlib import Path

import torch

from solrl_core.engine.engine import Engine

FOLDER = "pictures"
ROWS = 6  # prompts shown, spread over the evaluation set (the tiny world's: every kind of caption)


def shown(n_prompts: int, per_prompt: int, rows: int = ROWS) -> list[int]:
    """The evaluation images a picture shows: the first seed of `rows` prompts spread evenly over the set."""
    count = min(rows, n_prompts)
    return [(i * n_prompts // count) * per_prompt for i in range(count)]


def reward_captions(rewards: list[float], base: list[float]) -> list[str]:
    """Each tuned image's caption: 'reward 0.5 -> 1.0' from its base image's reward where that is known
    (a resumed run's regenerated base column has none), else 'reward 1.0'."""
    if not base:
        return [f"reward {r:.3g}" for r in rewards]
    return [f"reward {b:.3g} -> {r:.3g}" for b, r in zip(base, rewards)]


class EvalPictures:
    """A run's evaluation pictures: the base column kept from the base evaluation (or regenerated on a
    resume), each later evaluation's beside it. `write`: rank 0 writes; other ranks only take part
    in generating (a sharded model needs every rank)."""

    def __init__(self, run_dir: Path, prompts: list[str], per_prompt: int, write: bool = True) -> None:
        self.folder, self.write = Path(run_dir) / FOLDER, write
        flat = [p for p in prompts for _ in range(per_prompt)]
        self.index = shown(len(prompts), per_prompt)
        self.prompts = [flat[i] for i in self.index]
        self.base: tuple[torch.Tensor, list[float]] | None = None  # the base column: images and rewards

    def draw(self, engine: Engine, iteration: int, weights: str, images: torch.Tensor, rewards: torch.Tensor,
             seeds: torch.Tensor) -> str:
        """Write the picture of an evaluation (`images`: its shown images, `rewards` and `seeds`: every
        image's); returns its path ('' on a rank that does not write)."""
        from solrl_core.io.images import grid_rows, make_grid

        picked = [float(rewards[i]) for i in self.index]
        seeds_shown = [int(seeds[i]) for i in self.index]
        if weights == "base":
            self.base = (images, picked)
        elif self.base is None:  # resumed: the base evaluation's images are not in this process
            self.base = (engine.images(self.prompts, torch.tensor(seeds_shown), engine.config.sampler.eval_steps,
                                       "base"), [])
        columns = {"base": self.base[0]} if weights == "base" else {"base": self.base[0], f"{weights}, iteration "
                                                                                          f"{iteration}": images}
        captions = {"base": [f"reward {r:.3g}" for r in self.base[1]]} if self.base[1] else {}
        if weights != "base":
            captions[f"{weights}, iteration {iteration}"] = reward_captions(picked, self.base[1])
        if not self.write:
            return ""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"eval_{iteration:06d}.png"
        make_grid(columns, rows=grid_rows(self.prompts, seeds_shown), captions=captions).save(path)
        return str(path)
