"""Using a trained run: images from fixed seeds (`solrl infer` and `solrl.infer`, through the one
core function both call, `infer_request`, which checks the options and opens the engine); `solrl
export` is export.py.

The engine (engine.py) loads the base model once and, for a run, its checkpoint's adapters; any
weight set (base, trained, ema) is then a switch on the same transformer (`Policy.weights`). Images
for the same (prompt, seed) come from the same noise whatever the weights, so a grid of base next to
tuned shows what training changed and nothing else. The grids here are drawn for every command.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from solrl_core.data.words import check_words
from solrl_core.tools.sources import output_folder, prompt_texts, tool_config, weight_sets

if TYPE_CHECKING:  # torch: loaded only once the inputs are checked (infer_request)
    from solrl_core import events as ev
    from solrl_core.engine.engine import Engine
    from solrl_core.models.base import DiffusionModel


def check_vocabulary(model: DiffusionModel, prompts: list[str]) -> None:
    """The prompts against a loaded model's vocabulary (data/words.py: check_words)."""
    check_words(model.vocabulary, prompts)


@dataclass(frozen=True)
class InferRequest:
    prompts: list[str]
    seeds: list[int]  # the same seeds for every prompt
    weights: tuple[str, ...]  # e.g. ("base", "ema")
    steps: int
    out_dir: Path
    grid: bool = True


def infer(engine: Engine, req: InferRequest, bus: ev.EventBus) -> Path:
    """Write every image as PNG, `images.jsonl` (weights, prompt, seed, path) and `grid.png`
    (one row per (prompt, seed), one column per weight set). A video model's clip is written as MP4
    (an animated GIF without the video extra: the row's `video`) and as a PNG contact sheet of its frames in a row
    (`path`), and
    the grid shows the contact sheets. Returns the JSONL path."""
    import torch

    from solrl_core import events as ev
    from solrl_core.io.images import grid_rows, make_grid, save_png

    req.out_dir.mkdir(parents=True, exist_ok=True)
    per = len(req.seeds)
    flat = [p for p in req.prompts for _ in range(per)]
    seeds = torch.tensor(req.seeds * len(req.prompts), dtype=torch.long)
    columns = {}
    clips = ""  # a video model's: the format its clips were written in (mp4, or gif without the video extra)
    rows_path = req.out_dir / "images.jsonl"
    with open(rows_path, "w", encoding="utf-8") as rows:
        for weights in req.weights:
            t0 = time.perf_counter()
            images = engine.images(flat, seeds, req.steps, weights, progress=lambda done, total, w=weights: bus.emit(
                ev.ImagesProgress(weights=w, done=done, total=total)))
            columns[weights] = images
            for i, prompt in enumerate(flat):
                path = req.out_dir / weights / f"{i // per:03d}_seed{int(seeds[i])}.png"
                path.parent.mkdir(exist_ok=True)
                save_png(images[i], path)  # a clip: its contact sheet, frames in a row
                row = {"weights": weights, "prompt": prompt, "seed": int(seeds[i]),
                       "path": str(path.relative_to(req.out_dir))}
                if images.dim() == 5:  # a video model: the clip itself too (MP4, or GIF without the video extra)
                    from solrl_core.io.video_output import save_clip

                    row["video"] = str(save_clip(images[i], path.with_suffix("")).relative_to(req.out_dir))
                    clips = Path(row["video"]).suffix.lstrip(".")
                rows.write(json.dumps(row) + "\n")
            bus.emit(ev.ImagesWritten(weights=weights, count=len(flat), seconds=time.perf_counter() - t0,
                                      folder=str(req.out_dir / weights), clips=clips))
    if req.grid:
        grid = make_grid(columns, rows=grid_rows(flat, [int(x) for x in seeds]))
        grid.save(req.out_dir / "grid.png")
    return rows_path


def infer_request(run: Optional[Path], *, prompt: Optional[list[str]] = None, prompts: Optional[str] = None,
                  model: Optional[str] = None, model_path: Optional[Path] = None, seeds: int = 2, seed: int = 0,
                  steps: Optional[int] = None, weights: str = "ema", checkpoint: Optional[str] = None,
                  out: Optional[Path] = None, grid: bool = True, sets: Optional[list[str]] = None,
                  device: Optional[str] = None) -> tuple[Engine, InferRequest, Optional[Path]]:
    """What `solrl infer` (and `solrl.infer`) draws, from its options: the engine of RUN's checkpoint (or
    of a base model), the request (prompts checked against the model's words) and the checkpoint."""
    from solrl_core.data.words import known_words

    tuned = weight_sets(weights)
    cfg, ckpt = tool_config(run, model, model_path, checkpoint, sets=sets, flags={"run": {"device": device}})
    texts = prompt_texts(prompt, prompts, cfg.run.eval_prompts or cfg.run.prompts)
    check_words(known_words(cfg.model.loader, cfg.model.weights), texts)  # a tiny model's words, from its folder
    from solrl_core.engine.engine import open_engine  # torch: only once the inputs are checked

    engine = open_engine(cfg, checkpoint=ckpt)
    check_vocabulary(engine.model, texts)  # a vocabulary known only once loaded: before anything is written
    req = InferRequest(prompts=texts, seeds=list(range(seed, seed + seeds)),
                       weights=("base", *tuned) if ckpt else ("base",), steps=steps or cfg.sampler.eval_steps,
                       out_dir=output_folder(out, run, "infer"), grid=grid)
    return engine, req, ckpt
