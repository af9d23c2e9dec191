"""Where does a tiny run's `tinyworld_fidelity` fall come from? Background, shape interiors or edges;
colour shift, noise or blur; or simply more shapes.

    python benchmarks/fidelity_breakdown.py RUN [--checkpoint iter_N] [--seeds 2] [--picture docs/x.png]

Generates the run's evaluation prompts (run.eval_prompts) x --seeds fixed seeds with the base
weights and with a checkpoint's EMA weights (the images a run's evaluation scores, at
sampler.eval_steps), and splits each image's fidelity loss (1 - score) by where it is:

  background  pixels whose 3x3 neighbourhood, after a 3x3 mean, is all nearest the background colour
  interior    the same, all nearest one shape colour
  edge        the rest: the transitions between paint colours

and by what it is: in the flat regions, each pixel's offset from its paint colour is split into the
mean offset of that colour in that image (a colour shift) and the rest (noise); at the edges, the
distance off the straight RGB segment from the background to the shape colour (noise: a blurred
edge stays on it) and the edge band's width (blur: edge pixels per pixel of outline). Two
counterfactual scores say how much of the fall each explains: the fidelity with the noise taken out
(flat regions at their mean colour, edges projected onto their segment) and with the colour shift
taken out. The shares of pixels in each region say how much is composition (more shapes, more edges).

It also prints what controlled damage does to the base images (noise, blur, a brightness shift),
the ruler a fidelity change is read against, and with --picture writes a PNG: for a few prompts,
the base and tuned image and each one's per-pixel loss (white: 0 fidelity), upscaled.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from _common import add_common_args  # benchmarks/ is on sys.path when a script runs

from solrl_core.rewards.palette import PALETTE, TOLERANCE

PAL = PALETTE.numpy()  # [7, 3]: the background first, then the six shape colours
REGIONS = ("background", "interior", "edge")


def nearest(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel of [..., 3] floats in 0-255: the distance to the nearest paint colour and its index."""
    dist = np.linalg.norm(rgb[..., None, :] - PAL, axis=-1)  # [..., 7]
    return dist.min(-1), dist.argmin(-1)


def fidelity(rgb: np.ndarray) -> np.ndarray:
    """Per pixel: max(0, 1 - distance / TOLERANCE), as rewards/palette.py scores it."""
    return np.clip(1 - nearest(rgb)[0] / TOLERANCE, 0, None)


def _box(a: np.ndarray) -> np.ndarray:
    """3x3 mean over the last-but-one two axes, edges replicated."""
    p = np.pad(a, ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = a.shape[:2]
    return sum(p[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)) / 9


def regions(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[H, W] region (0 background, 1 interior, 2 edge) and paint label of one image [H, W, 3]."""
    label = nearest(_box(rgb))[1]
    p = np.pad(label, 1, mode="edge")
    h, w = label.shape
    flat = np.logical_and.reduce([p[dy:dy + h, dx:dx + w] == label for dy in range(3) for dx in range(3)])
    region = np.where(flat, np.where(label == 0, 0, 1), 2)
    return region, label


def _segment(rgb: np.ndarray) -> np.ndarray:
    """Each pixel projected onto the nearest straight segment from the background to a shape colour."""
    bg, dirs = PAL[0], PAL[1:] - PAL[0]  # [6, 3]
    t = np.clip((rgb - bg) @ dirs.T / (dirs * dirs).sum(1), 0, 1)  # [..., 6]
    points = bg + t[..., None] * dirs  # [..., 6, 3]
    k = np.linalg.norm(rgb[..., None, :] - points, axis=-1).argmin(-1)
    return np.take_along_axis(points, k[..., None, None], -2)[..., 0, :]


def analyse(rgb: np.ndarray) -> dict[str, float]:
    """The breakdown of one image [H, W, 3] (floats 0-255): see the module docstring."""
    region, label = regions(rgb)
    loss = 1 - fidelity(rgb)
    out: dict[str, float] = {"fidelity": float(1 - loss.mean())}
    flat = region < 2
    offset = rgb - PAL[label]
    bias = np.zeros_like(rgb)
    for k in np.unique(label[flat]):
        where = flat & (label == k)
        bias[where] = offset[where].mean(0)
    noise = offset - bias
    for r, name in enumerate(REGIONS):
        where = region == r
        out[f"{name}.share"] = float(where.mean())
        out[f"{name}.loss"] = float(loss[where].sum() / loss.size)  # its part of 1 - fidelity
        if r < 2:
            out[f"{name}.shift"] = float(np.linalg.norm(bias[where], axis=-1).mean()) if where.any() else 0.0
            out[f"{name}.noise"] = float(np.sqrt((noise[where] ** 2).sum(-1).mean())) if where.any() else 0.0
    edge = region == 2
    on_segment = _segment(rgb)
    out["edge.off_segment"] = float(np.linalg.norm(rgb[edge] - on_segment[edge], axis=-1).mean()) if edge.any() else 0.0
    shape = label > 0
    p = np.pad(shape, 1, mode="edge")
    h, w = shape.shape
    outline = shape & ~np.logical_and.reduce([p[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)])
    out["edge.width"] = float(edge.sum() / max(int(outline.sum()), 1))
    denoised = np.where(flat[..., None], PAL[label] + bias, on_segment)
    unshifted = np.where(flat[..., None], rgb - bias, rgb)
    out["fidelity_without_noise"] = float(fidelity(denoised).mean())
    out["fidelity_without_shift"] = float(fidelity(unshifted).mean())
    return out


def mean_breakdown(images: np.ndarray) -> dict[str, float]:
    rows = [analyse(img) for img in images]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def damaged(images: np.ndarray) -> dict[str, np.ndarray]:
    """Controlled damage to [B, H, W, 3] images (0-255): the ruler a fidelity change is read against."""
    rng = np.random.default_rng(0)
    t = torch.from_numpy(images).permute(0, 3, 1, 2)
    blur = torch.nn.functional.avg_pool2d(t, 3, stride=1, padding=1, count_include_pad=False)
    out = {f"noise std {s}": images + rng.normal(0, s, images.shape) for s in (2, 4, 8)}
    out["3x3 blur"] = blur.permute(0, 2, 3, 1).numpy()
    out.update({f"brighter +{b}": images + b for b in (4, 8, 16)})
    return {k: np.clip(v, 0, 255) for k, v in out.items()}


def generate(args: argparse.Namespace) -> tuple[list[str], np.ndarray, np.ndarray, str]:
    """The evaluation prompts x seeds, with the base and the checkpoint's EMA weights: [B, H, W, 3] 0-255."""
    from solrl_core.config.convert import load_run_config
    from solrl_core.config.presets import apply_overrides
    from solrl_core.data.prompts import load_prompts
    from solrl_core.engine.checkpoint import list_checkpoints, pick_checkpoint
    from solrl_core.engine.engine import open_engine
    from solrl_core.loop.evaluation import eval_seeds

    cfg = apply_overrides(load_run_config(args.run), args.sets,
                          {"run": {"device": args.device, "threads": args.threads}})
    checkpoint = pick_checkpoint(args.run, list_checkpoints(args.run), args.checkpoint)
    engine = open_engine(cfg, checkpoint=checkpoint)
    prompts = load_prompts(args.prompts or cfg.run.eval_prompts)
    flat = [p for p in prompts for _ in range(args.seeds)]
    seeds = eval_seeds(len(prompts), args.seeds)
    out = [engine.images(flat, seeds, cfg.sampler.eval_steps, w).permute(0, 2, 3, 1).clamp(0, 1).numpy() * 255
           for w in ("base", "ema")]
    return flat, out[0], out[1], checkpoint.name


def picture(path: Path, base: np.ndarray, tuned: np.ndarray, prompts: list[str], rows: int, scale: int = 3) -> None:
    """For `rows` images evenly spread over the set: base, its loss map, tuned, its loss map."""
    from PIL import Image

    pick = np.linspace(0, len(base) - 1, rows).round().astype(int)
    cells = []
    for i in pick:
        maps = [np.repeat((255 * (1 - fidelity(img)))[..., None], 3, -1) for img in (base[i], tuned[i])]
        cells.append(np.concatenate([base[i], maps[0], tuned[i], maps[1]], axis=1))
    grid = np.concatenate(cells, axis=0).round().clip(0, 255).astype(np.uint8)
    Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale), Image.NEAREST).save(path,
                                                                                                     optimize=True)
    print(f"picture: {path} (rows: {', '.join(repr(prompts[i]) for i in pick)}; columns: base, its loss, tuned, its "
          f"loss)")


def table(named: dict[str, dict[str, float]]) -> str:
    cols = list(named)
    keys = list(next(iter(named.values())))
    lines = ["| measure | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {k} | " + " | ".join(f"{named[c][k]:.4f}" for c in cols) + " |" for k in keys]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, "write the figures here")
    p.add_argument("run", type=Path, help="a run folder")
    p.add_argument("--checkpoint", help="its checkpoint (default: the newest)")
    p.add_argument("--prompts", help="prompt set (default: the run's run.eval_prompts)")
    p.add_argument("--seeds", type=int, default=2, help="fixed seeds per prompt (default: 2)")
    p.add_argument("--picture", type=Path, help="write the base/tuned picture here")
    p.add_argument("--rows", type=int, default=6, help="images in the picture (default: 6)")
    args = p.parse_args(argv)
    prompts, base, tuned, name = generate(args)
    figures = {"base": mean_breakdown(base), f"ema {name}": mean_breakdown(tuned)}
    figures["change"] = {k: figures[f"ema {name}"][k] - figures["base"][k] for k in figures["base"]}
    print(f"{len(prompts)} images ({args.seeds} seeds per prompt), base and {name}'s EMA weights\n")
    print(table(figures))
    ruler = {k: mean_breakdown(v) for k, v in damaged(base).items()}
    ruler = {k: {"fidelity change": v["fidelity"] - figures["base"]["fidelity"]} for k, v in ruler.items()}
    print("\ncontrolled damage to the base images:\n")
    print("| damage | fidelity change |\n|---|---|\n"
          + "\n".join(f"| {k} | {v['fidelity change']:+.4f} |" for k, v in ruler.items()))
    if args.picture:
        picture(args.picture, base, tuned, prompts, args.rows)
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "damage": ruler, "images": len(prompts)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
