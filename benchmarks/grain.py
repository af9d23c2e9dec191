"""The grain a tiny-world run adds to its images: the speckle on the dark background, measured.

Every tiny-world scene is flat paint: shapes on a near-black background (solrl_core/data/tinyworld.py). A run
that buys reward with noise leaves the background speckled, which the eye sees in RUN/pictures and the
GenEval-style reward does not. This script draws the same (prompt, seed) pairs with the base weights and a
run's EMA weights (`solrl.infer`: the same noise for both) and measures, per image, the standard deviation of
the luminance (0-255) of its background pixels (every channel below DARK); the grain of a weight set is the
mean over images. It prints each run's base and EMA grain, their ratio, and the share of images whose
background got noisier.

    python benchmarks/grain.py RUN [RUN ...] [--prompts tinyworld_eval] [--seeds 2]

Compare runs by their ratio (EMA over base, the same images): 1.0 is no added grain.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np

DARK = 64  # a background pixel: every channel below this (the paint of the shapes is far brighter)


def background_spread(path: Path) -> float:
    """The standard deviation of the luminance of an image's background pixels (nan when it has none)."""
    from PIL import Image

    rgb = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64)
    dark = (rgb < DARK).all(axis=-1)
    if not dark.any():
        return float("nan")
    luminance = rgb @ np.array([0.299, 0.587, 0.114])
    return float(luminance[dark].std())


def measure(run: Path, prompts: str, seeds: int, checkpoint: str | None = None) -> dict[str, float]:
    """Base and EMA grain of one run (`checkpoint`, else its newest) on `prompts` x `seeds` seeds (images
    written to a temporary folder)."""
    import solrl

    with tempfile.TemporaryDirectory(prefix="grain-") as tmp:
        result = solrl.infer(run, prompts=prompts, seeds=seeds, weights="ema", checkpoint=checkpoint,
                             out=Path(tmp) / "infer", grid=False, quiet=True)
        rows = [json.loads(line) for line in result.index.read_text(encoding="utf-8").splitlines()]
        spread = {(r["weights"], r["prompt"], r["seed"]): background_spread(result.out_dir / r["path"]) for r in rows}
    pairs = [(spread[("base", p, s)], v) for (w, p, s), v in spread.items() if w == "ema"]
    pairs = [(b, e) for b, e in pairs if np.isfinite(b) and np.isfinite(e)]
    base, ema = float(np.mean([b for b, _ in pairs])), float(np.mean([e for _, e in pairs]))
    return {"images": len(pairs), "base": base, "ema": ema, "ratio": ema / base,
            "noisier": float(np.mean([e > b for b, e in pairs]))}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    p.add_argument("--prompts", default="tinyworld_eval", help="prompt set (default: tinyworld_eval)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per prompt (default: 2)")
    args = p.parse_args(argv)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print("grain: the standard deviation of background luminance (0-255), mean over images; ratio = ema / base")
    out = []
    for run in args.runs:
        m = measure(run, args.prompts, args.seeds)
        out.append({"run": str(run), **m})
        print(f"{run}: {m['images']} images, base {m['base']:.3f}, ema {m['ema']:.3f}, ratio {m['ratio']:.3f}, "
              f"background noisier in {m['noisier']:.0%} of images")
    return out


if __name__ == "__main__":
    main()
