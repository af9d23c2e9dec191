"""Pictures: a tensor image as uint8 pixels, a PNG, and grids of images side by side under their
names (every command's grids: infer, explore, the trackers' samples, the evaluations' pictures)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def save_png(image: torch.Tensor, path: Path) -> None:
    """An image [3, H, W], or a clip [F, 3, H, W] as its contact sheet (frames in a row)."""
    from PIL import Image

    from solrl_core.io.video_output import still

    Image.fromarray(to_uint8(still(image))).save(path)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Floats in [0, 1], [3, H, W] or [B, 3, H, W] -> uint8 [H, W, 3] or [B, H, W, 3]: every picture and
    every pixel-reading reward goes through this one rounding."""
    arr = images.detach().float().clamp(0, 1).mul_(255).round_().to(torch.uint8)  # one float copy, not three
    return arr.movedim(-3, -1).cpu().numpy()


def make_grid(columns: dict[str, torch.Tensor], min_cell: int = 128, rows: list[str] | None = None,
              captions: dict[str, list[str]] | None = None):  # noqa: ANN201 - PIL image
    """Columns of images side by side under their names; small images are enlarged (nearest) to at
    least `min_cell` pixels so a 32 px tiny-world image is visible. `rows`: a label left of each row
    (its prompt, seed); `captions`: a line under each image of a column (its reward)."""
    from PIL import Image, ImageDraw

    from solrl_core.io.video_output import stills

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
