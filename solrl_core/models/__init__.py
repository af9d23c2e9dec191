"""Model loaders by name. A model preset names its loader; the loader builds a DiffusionModel:
`tiny` (models/tiny.py, built offline), `tiny_video` (models/tiny_video.py, the tiny moving world's
Wan) or a real diffusers model named in
models/layouts.py's LAYOUTS (from model.path or the hub: models/diffusers_models.py)."""

from __future__ import annotations

import torch

from solrl_core.config.schema import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.layouts import LAYOUTS

__all__ = ["Conditioning", "DiffusionModel", "load_model"]

LOADERS = ("tiny", "tiny_video", *LAYOUTS)


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> DiffusionModel:
    if cfg.loader == "tiny":
        from solrl_core.models.tiny import build_tiny

        return build_tiny(cfg, device, dtype)
    if cfg.loader == "tiny_video":
        from solrl_core.models.tiny_video import build_tiny_video

        return build_tiny_video(cfg, device, dtype)
    if cfg.loader in LOADERS:
        from solrl_core.models.diffusers_models import load_diffusers_model

        return load_diffusers_model(cfg, LAYOUTS[cfg.loader], device, dtype)
    raise SolrlError(f"unknown model loader '{cfg.loader}'", f"model.loader must be one of: {', '.join(LOADERS)}")
