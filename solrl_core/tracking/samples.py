"""The sample grid the trackers show: one prompt's Stage-2 samples, best reward first, each
captioned with its reward and seed. A video model's samples are clips: the grid shows each as its
frames in a row (its contact sheet), and the clips themselves, side by side in the grid's order, are
written beside it as one video (MP4 with the `video` extra, else GIF: video_output.py) for the
trackers that play videos.

The images are decoded again from the kept latents only on the iterations that send a grid, and
only when a tracker is configured, so a run without trackers does no extra work."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from solrl_core import events as ev

FOLDER = "samples"


def due(run_log: tuple[str, ...], image_every: int, iteration: int, rank: int) -> bool:
    """Whether the iteration just finished sends a grid (rank 0 holds the first prompt group)."""
    return bool(run_log) and image_every > 0 and iteration % image_every == 0 and rank == 0


@torch.no_grad()
def sample_grid(engine, batch, run_dir: Path, iteration: int) -> ev.SampleGrid:  # type: ignore[no-untyped-def]
    """Write RUN/samples/iter_NNNNNN.png: the first prompt group of `batch` (a RolloutBatch),
    its samples from best to worst reward, each captioned with its reward and seed, decoded by
    `engine`; for clips also RUN/samples/iter_NNNNNN.mp4 (or .gif), the clips side by side."""
    from solrl_core.io.images import make_grid
    from solrl_core.io.video_output import save_clip, side_by_side

    t0 = time.perf_counter()
    members = torch.nonzero(batch.groups == batch.groups[0]).flatten()
    order = members[torch.argsort(batch.rewards[members].float(), descending=True, stable=True)]
    images = engine.decode(batch.latents[order])
    rewards = [float(r) for r in batch.rewards[order]]
    seeds = [int(s) for s in batch.seeds[order]]
    names = ["best" if i == 0 else "worst" if i == len(rewards) - 1 else f"#{i + 1}" for i in range(len(rewards))]
    columns = {f"{name}, reward {r:.3g}": images[i:i + 1] for i, (name, r) in enumerate(zip(names, rewards))}
    captions = {name: [f"seed {s}"] for name, s in zip(columns, seeds)}
    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"iter_{iteration:06d}.png"
    make_grid(columns, rows=[batch.prompts[int(order[0])]], captions=captions).save(path)
    video = str(save_clip(side_by_side(images), path.with_suffix(""))) if images.dim() == 5 else ""
    return ev.SampleGrid(iteration=iteration, prompt=batch.prompts[int(order[0])], rewards=rewards, path=str(path),
                         seconds=time.perf_counter() - t0, seeds=seeds, video=video)
