"""HPS v2.1 (Human Preference Score): an open_clip ViT-H/14 fine-tuned on human preference pairs.

The score is the official hpsv2 one: the diagonal of image_features @ text_features.T with both
L2-normalised. The checkpoint holds the whole model, so the architecture is created empty
(`pretrained=None`: the laion base weights are never fetched) and the checkpoint loaded over it by
`open_clip.load_checkpoint`, which unwraps a 'state_dict' key and strips a 'module.' prefix. Images
go through open_clip's eval transform for the model (shorter side to its image size, bicubic,
centre crop, its mean and std) on tensors; the BPE vocabulary ships inside open_clip.

Weights: `ctx.path` is a folder holding HPS_v2.1_compressed.pt (the reward_ckpts folder of the
official docs) or the path of that file; otherwise hub xswu/HPSv2 (or the Hugging Face cache). To
score with another CLIP architecture, put `open_clip_config.json` next to the checkpoint: an open_clip
model config (embed_dim, vision_cfg, text_cfg, as in open_clip/model_configs/ViT-H-14.json). It is
registered with `open_clip.add_model_config` under the name 'open_clip_config' (the latest loaded
wins) and replaces ViT-H-14 for the model and its tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import open_clip
import torch
import torch.nn.functional as F

from solrl_core.errors import SolrlError
from solrl_core.rewards.base import RewardContext
from solrl_core.rewards.preprocess import resize_crop_normalize, score_in_batches
from solrl_core.rewards.weights import hub_file, local_folder

CHECKPOINT = "HPS_v2.1_compressed.pt"
HUB_REPO = "xswu/HPSv2"
ARCHITECTURE = "ViT-H-14"
CONFIG = "open_clip_config.json"
CONFIG_KEYS = ("embed_dim", "vision_cfg", "text_cfg")


def locate(ctx: RewardContext) -> tuple[Path, Path | None]:
    """The checkpoint, and the open_clip config beside it when a local path has one."""
    if not ctx.path:
        return hub_file("hpsv2", HUB_REPO, CHECKPOINT), None
    path = Path(ctx.path).expanduser()
    checkpoint = path if path.is_file() else local_folder("hpsv2", ctx.path, [CHECKPOINT]) / CHECKPOINT
    config = checkpoint.parent / CONFIG
    return checkpoint, config if config.is_file() else None


def architecture(config: Path | None) -> str:
    """The open_clip model name to create: ViT-H-14, or `config` registered under its file name."""
    if config is None:
        return ARCHITECTURE
    missing = [k for k in CONFIG_KEYS if k not in json.loads(config.read_text())]
    if missing:
        raise SolrlError(f"{config} lacks {', '.join(missing)}",
                         "write an open_clip model config there, like open_clip/model_configs/ViT-H-14.json")
    open_clip.add_model_config(config)
    return config.stem


class HPSv2:
    """HPS v2.1: normalised image features . normalised text features, image i against prompt i."""

    name = "hpsv2"

    def __init__(self, model: Any, tokenizer: Callable[[list[str]], torch.Tensor], ctx: RewardContext) -> None:
        cfg = open_clip.get_model_preprocess_cfg(model)
        size = (cfg["size"],) * 2 if isinstance(cfg["size"], int) else tuple(cfg["size"])
        if size[0] != size[1]:
            raise SolrlError(f"the HPS model takes {size[0]}x{size[1]} images; only square inputs are supported",
                             "use an open_clip config with a square vision_cfg.image_size")
        self.size, self.mean, self.std = size[0], list(cfg["mean"]), list(cfg["std"])
        self.model = model.to(device=ctx.device, dtype=ctx.dtype).eval()
        self.tokenizer = tokenizer
        self.device, self.dtype, self.batch_size = ctx.device, ctx.dtype, ctx.batch_size

    @classmethod
    def load(cls, ctx: RewardContext) -> HPSv2:
        checkpoint, config = locate(ctx)  # before building the model: a missing file fails fast
        arch = architecture(config)
        model = open_clip.create_model(arch, pretrained=None)
        try:
            open_clip.load_checkpoint(model, str(checkpoint))
        except RuntimeError as exc:
            raise SolrlError(f"{checkpoint} does not fit the open_clip architecture {arch} ({exc})",
                             f"use {CHECKPOINT} with {ARCHITECTURE}, or put the matching {CONFIG} beside it") from exc
        return cls(model, open_clip.get_tokenizer(arch), ctx)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return score_in_batches(images, prompts, self.batch_size, self._score)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        pixels = resize_crop_normalize(images.to(self.device), self.size, self.size, self.mean, self.std).to(self.dtype)
        image = F.normalize(self.model.encode_image(pixels).float(), dim=-1)
        text = F.normalize(self.model.encode_text(self.tokenizer(prompts).to(self.device)).float(), dim=-1)
        return (image * text).sum(-1)  # the diagonal of image @ text.T
