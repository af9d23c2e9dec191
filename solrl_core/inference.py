"""Using a trained run: images from fixed seeds (`solrl infer`); `solrl export` is export.py.

`load_tuned` loads the base model once and, for a run, its checkpoint's adapters; any weight set
(base, trained, ema) is then a switch on the same transformer (`Policy.weights`). Images for the
same (prompt, seed) come from the same noise whatever the weights, so a grid of base next to tuned
shows what training changed and nothing else.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from solrl_core import events as ev
from solrl_core.config import Config
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.policy import OLD, Policy
from solrl_core.precision.quantize import LayerRule
from solrl_core.rollout import RolloutCopy
from solrl_core.sampler import Sampler


@dataclass
class Loaded:
    config: Config
    model: DiffusionModel
    policy: Policy
    device: torch.device
    dtype_name: str
    dtype: torch.dtype
    explore_copy: RolloutCopy | None = None  # base + old adapter at the explore precision, when asked for
    checkpoint: Path | None = None  # the checkpoint its adapters came from (None: untrained)


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


def load_tuned(cfg: Config, checkpoint: Path | None, explore: bool = False, numerics_only: bool = False) -> Loaded:
    """The model of `cfg` with LoRA adapters, loaded from `checkpoint` when given (else untrained);
    with `explore`, also the Stage-1 copy at cfg's explore precision, refreshed from base + old.
    `numerics_only` skips the hardware check of that precision: for measuring its numerics where it
    has only a reference kernel (fp8 on a CPU: torch._scaled_mm's CPU kernel, no speed-up)."""
    import copy

    from solrl_core.checkpoint import load_adapters
    from solrl_core.precision.hardware import require_explore_precision
    from solrl_core.models import load_model
    from solrl_core.precision.resolve import resolve_machine
    from solrl_core.device import resolve_device, resolve_dtype
    from solrl_core.threads import apply_threads

    device = resolve_device(cfg.run.device)
    dtype_name, dtype = resolve_dtype(cfg.run.dtype, device)
    apply_threads(cfg.run.threads)
    model = load_model(cfg.model, device, dtype)
    explore_copy = None
    if explore:  # copied before the adapters are added, as a training session does
        precision = resolve_machine(cfg, device, dtype_name).explore_precision
        if not numerics_only:
            require_explore_precision(precision, device)
        explore_copy = RolloutCopy(copy.deepcopy(model.transformer), precision, LayerRule.of(cfg.model))
    policy = Policy(model.transformer, cfg.model)
    if checkpoint is not None:
        load_adapters(checkpoint, policy)
    if explore_copy is not None:
        explore_copy.refresh(policy.merged_weights(OLD))
    return Loaded(cfg, model, policy, device, dtype_name, dtype, explore_copy, checkpoint)


def encode_each(model: DiffusionModel, prompts: list[str], per_prompt: int, chunk: int = 64) -> Conditioning:
    """Each prompt encoded once, repeated `per_prompt` times (prompt-major order)."""
    with torch.no_grad():
        parts = [model.encode(prompts[i:i + chunk]) for i in range(0, len(prompts), chunk)]
    return Conditioning.cat(parts)[torch.arange(len(prompts)).repeat_interleave(per_prompt)]


@torch.no_grad()
def decode_in_chunks(model: DiffusionModel, latents: torch.Tensor, chunk: int) -> torch.Tensor:
    """Images [B, 3, H, W] in [0, 1] on the CPU, decoded `chunk` latents at a time (VAE memory)."""
    return torch.cat([model.decode(latents[i:i + chunk]).float().cpu() for i in range(0, latents.shape[0], chunk)])


@torch.no_grad()
def render(loaded: Loaded, cond: Conditioning, seeds: torch.Tensor, weights: str, steps: int) -> torch.Tensor:
    """Images [B, 3, H, W] in [0, 1] for one seed per conditioning row, with `weights`."""
    sampler = loaded.config.sampler
    with loaded.policy.weights(weights) as net:
        latents = Sampler.of(sampler).generate(loaded.model, net, cond, seeds, steps, loaded.dtype)
    return decode_in_chunks(loaded.model, latents, sampler.rollout_batch)


@dataclass(frozen=True)
class InferRequest:
    prompts: list[str]
    seeds: list[int]  # the same seeds for every prompt
    weights: tuple[str, ...]  # e.g. ("base", "ema")
    steps: int
    out_dir: Path
    grid: bool = True


def infer(loaded: Loaded, req: InferRequest, bus: ev.EventBus) -> Path:
    """Write every image as PNG, `images.jsonl` (weights, prompt, seed, path) and `grid.png`
    (one row per (prompt, seed), one column per weight set). Returns the JSONL path."""
    req.out_dir.mkdir(parents=True, exist_ok=True)
    per = len(req.seeds)
    flat = [p for p in req.prompts for _ in range(per)]
    seeds = torch.tensor(req.seeds * len(req.prompts), dtype=torch.long)
    cond = encode_each(loaded.model, req.prompts, per)
    columns = {}
    rows_path = req.out_dir / "images.jsonl"
    with open(rows_path, "w", encoding="utf-8") as rows:
        for weights in req.weights:
            t0 = time.perf_counter()
            images = render(loaded, cond, seeds, weights, req.steps)
            columns[weights] = images
            for i, prompt in enumerate(flat):
                path = req.out_dir / weights / f"{i // per:03d}_seed{int(seeds[i])}.png"
                path.parent.mkdir(exist_ok=True)
                save_png(images[i], path)
                rows.write(json.dumps({"weights": weights, "prompt": prompt, "seed": int(seeds[i]),
                                       "path": str(path.relative_to(req.out_dir))}) + "\n")
            bus.emit(ev.ImagesWritten(weights=weights, count=len(flat), seconds=time.perf_counter() - t0,
                                      folder=str(req.out_dir / weights)))
    if req.grid:
        grid = make_grid(columns, rows=grid_rows(flat, [int(x) for x in seeds]))
        grid.save(req.out_dir / "grid.png")
    return rows_path


def save_png(image: torch.Tensor, path: Path) -> None:
    from PIL import Image

    Image.fromarray(to_uint8(image)).save(path)


def to_uint8(image: torch.Tensor):  # noqa: ANN201 - numpy array [H, W, 3]
    return (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()


def make_grid(columns: dict[str, torch.Tensor], min_cell: int = 128, rows: list[str] | None = None,
              captions: dict[str, list[str]] | None = None):  # noqa: ANN201 - PIL image
    """Columns of images side by side under their names; small images are enlarged (nearest) to at
    least `min_cell` pixels so a 32 px tiny-world image is visible. `rows`: a label left of each row
    (its prompt, seed); `captions`: a line under each image of a column (its reward)."""
    from PIL import Image, ImageDraw

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
