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


MIN_CELL = 128  # pixels a side an image (a clip's frame) is enlarged to at least
LABEL_WIDTH = 240  # pixels of the row labels' column: a prompt wraps within it
PAD = 4
FONT_SIZE = 14


def make_grid(columns: dict[str, torch.Tensor], min_cell: int = MIN_CELL, rows: list[str] | None = None,
              captions: dict[str, list[str]] | None = None):  # noqa: ANN201 - PIL image
    """Columns of images side by side under their names; small images are enlarged (nearest) to at
    least `min_cell` pixels a side (a clip's frames each) so a 32 px tiny-world shape is seen. `rows`:
    a label left of each row (its prompt, seed); `captions`: lines under each image of a column (its
    reward). Every text is whole, wrapped to its column in a TrueType font (`font`)."""
    from PIL import Image, ImageDraw

    from solrl_core.io.video_output import enlargement, stills

    columns = {name: stills(batch) for name, batch in columns.items()}  # a clip: its frames in a row
    names = list(columns)
    count, _, h, w = columns[names[0]].shape
    scale = enlargement(h, w, min_cell)
    ch, cw, pad = h * scale, w * scale, PAD
    face = font()
    lh = line_height(face)
    label_w = LABEL_WIDTH if rows else 0
    heads = [wrap(name, face, cw - 4) for name in names]
    header = max(len(lines) for lines in heads) * lh + pad
    labels = [wrap(text, face, label_w - 8) for text in rows or []]
    notes = {name: [wrap(text, face, cw - 4) for text in captions[name]] for name in names if name in (captions or {})}
    below = [max((len(notes[name][r]) for name in notes), default=0) * lh for r in range(count)]
    heights = [max(ch + below[r], len(labels[r]) * lh if labels else 0) for r in range(count)]
    grid = Image.new("RGB", (label_w + len(names) * (cw + pad) + pad, header + sum(heights) + (count + 1) * pad), (255,
            255, 255))
    draw = ImageDraw.Draw(grid)
    tops = [header + pad + sum(heights[:r]) + r * pad for r in range(count)]
    for r, lines in enumerate(labels):
        _lines(draw, (4, tops[r]), lines, face, lh, (0, 0, 0))
    for c, name in enumerate(names):
        x = label_w + pad + c * (cw + pad)
        _lines(draw, (x + 2, 2), heads[c], face, lh, (0, 0, 0))
        for r in range(count):
            grid.paste(Image.fromarray(to_uint8(columns[name][r])).resize((cw, ch), Image.NEAREST), (x, tops[r]))
            if name in notes:
                _lines(draw, (x + 2, tops[r] + ch + 1), notes[name][r], face, lh, (60, 60, 60))
    return grid


def font(size: int = FONT_SIZE):  # noqa: ANN201 - PIL font
    """A legible font offline: Pillow's bundled TrueType face (Pillow >= 10.1, built with FreeType),
    else its small bitmap one."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 takes no size
        return ImageFont.load_default()


def line_height(face) -> int:  # type: ignore[no-untyped-def]
    return int(face.getbbox("Ag")[3]) + 3


def wrap(text: str, face, width: int) -> list[str]:  # type: ignore[no-untyped-def]
    """`text` in lines no wider than `width` pixels, broken between words (a word wider than a line
    between its letters); nothing is cut."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split():
            while len(word) > 1 and face.getlength(word) > width:  # a word alone wider than the line
                if line:
                    lines.append(line)
                    line = ""
                cut = max([i for i in range(1, len(word)) if face.getlength(word[:i]) <= width] or [1])
                lines.append(word[:cut])
                word = word[cut:]
            trial = f"{line} {word}" if line else word
            if line and face.getlength(trial) > width:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
    return lines


def _lines(draw, at: tuple[int, int], lines: list[str], face, lh: int,  # type: ignore[no-untyped-def]
           fill: tuple[int, int, int]) -> None:
    for i, text in enumerate(lines):
        draw.text((at[0], at[1] + i * lh), text, fill=fill, font=face)


def grid_rows(prompts: list[str], seeds: list[int] | None = None) -> list[str]:
    """The row labels of a grid: each whole prompt, with its seed where there is one."""
    if seeds is None:
        return list(prompts)
    return [f"{p} / seed {s}" for p, s in zip(prompts, seeds)]
