"""Using a trained run: images from fixed seeds (`solrl infer`); `solrl export` is export.py.

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
from typing import TYPE_CHECKING

import torch

from solrl_core import events as ev
from solrl_core.errors import SolrlError
from solrl_core.models.base import DiffusionModel

if TYPE_CHECKING:
    from solrl_core.engine import Engine


def check_vocabulary(model: DiffusionModel, prompts: list[str]) -> None:
    """A model with a fixed vocabulary (the tiny one) would silently drop the words it does not know:
    name them instead, with the words it does know."""
    import re

    if not model.vocabulary:
        return
    known = set(model.vocabulary)
    unknown = list(dict.fromkeys(w for p in prompts for w in re.findall(r"\w+", p.lower()) if w not in known))
    if unknown:
        raise SolrlError(f"the model does not know the word{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(w) for w in unknown)}: its text encoder would drop "
                         f"{'them' if len(unknown) > 1 else 'it'}",
                         f"write prompts from its vocabulary: {' '.join(sorted(known))} (e.g. 'a red circle left of a blue square')")


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
    (an animated GIF without the video extra: the row's `video`) and as a PNG contact sheet of its frames in a row (`path`), and
    the grid shows the contact sheets. Returns the JSONL path."""
    req.out_dir.mkdir(parents=True, exist_ok=True)
    per = len(req.seeds)
    flat = [p for p in req.prompts for _ in range(per)]
    seeds = torch.tensor(req.seeds * len(req.prompts), dtype=torch.long)
    columns = {}
    rows_path = req.out_dir / "images.jsonl"
    with open(rows_path, "w", encoding="utf-8") as rows:
        for weights in req.weights:
            t0 = time.perf_counter()
            images = engine.images(flat, seeds, req.steps, weights)
            columns[weights] = images
            for i, prompt in enumerate(flat):
                path = req.out_dir / weights / f"{i // per:03d}_seed{int(seeds[i])}.png"
                path.parent.mkdir(exist_ok=True)
                save_png(images[i], path)  # a clip: its contact sheet, frames in a row
                row = {"weights": weights, "prompt": prompt, "seed": int(seeds[i]), "path": str(path.relative_to(req.out_dir))}
                if images.dim() == 5:  # a video model: the clip itself too (MP4, or GIF without the video extra)
                    from solrl_core.video_output import save_clip

                    row["video"] = str(save_clip(images[i], path.with_suffix("")).relative_to(req.out_dir))
                rows.write(json.dumps(row) + "\n")
            bus.emit(ev.ImagesWritten(weights=weights, count=len(flat), seconds=time.perf_counter() - t0,
                                      folder=str(req.out_dir / weights)))
    if req.grid:
        grid = make_grid(columns, rows=grid_rows(flat, [int(x) for x in seeds]))
        grid.save(req.out_dir / "grid.png")
    return rows_path


def save_png(image: torch.Tensor, path: Path) -> None:
    """An image [3, H, W], or a clip [F, 3, H, W] as its contact sheet (frames in a row)."""
    from PIL import Image

    from solrl_core.video_output import still

    Image.fromarray(to_uint8(still(image))).save(path)


def to_uint8(image: torch.Tensor):  # noqa: ANN201 - numpy array [H, W, 3]
    return (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()


def make_grid(columns: dict[str, torch.Tensor], min_cell: int = 128, rows: list[str] | None = None,
              captions: dict[str, list[str]] | None = None):  # noqa: ANN201 - PIL image
    """Columns of images side by side under their names; small images are enlarged (nearest) to at
    least `min_cell` pixels so a 32 px tiny-world image is visible. `rows`: a label left of each row
    (its prompt, seed); `captions`: a line under each image of a column (its reward)."""
    from PIL import Image, ImageDraw

    from solrl_core.video_output import stills

    columns = {name: stills(batch) for name, batch in columns.items()}  # a clip: its frames in a row
    names = list(columns)
    count, _, h, w = columns[names[0]].shape
    scale = max(1, -(-min_cell // max(h, w)))
    ch, cw, header, pad = h * scale, w * scale, 16, 2
    label_w = 6 * min(max((len(r) for r in rows), default=0), LABEL_CHARS) + 8 if rows else 0
    line = CAPTION_HEIGHT if captions else 0
    grid = Image.new("RGB", (label_w + len(names) * (cw + pad) + pad, header + count * (ch + line + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    for r, text in enumerate(rows or []):
        draw.text((4, header + pad + r * (ch + line + pad) + ch // 2 - 5), _clip(text, label_w // 6 - 1), fill=(0, 0, 0))
    for c, name in enumerate(names):
        x = label_w + pad + c * (cw + pad)
        draw.text((x + 2, 2), _clip(name, cw // 6), fill=(0, 0, 0))
        for r in range(count):
            y = header + pad + r * (ch + line + pad)
            grid.paste(Image.fromarray(to_uint8(columns[name][r])).resize((cw, ch), Image.NEAREST), (x, y))
            if captions and name in captions:
                draw.text((x + 2, y + ch + 1), _clip(captions[name][r], cw // 6), fill=(60, 60, 60))
    return grid


LABEL_CHARS = 40  # a row label longer than this is cut, ending in '...'
CAPTION_HEIGHT = 12


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:max(chars - 3, 1)] + "..."


def grid_rows(prompts: list[str], seeds: list[int] | None = None) -> list[str]:
    """The row labels of a grid: each prompt, with its seed where there is one."""
    if seeds is None:
        return list(prompts)
    return [_clip(p, LABEL_CHARS - len(f" / seed {s}")) + f" / seed {s}" for p, s in zip(prompts, seeds)]  # the seed is never cut
