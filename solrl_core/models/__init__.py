"""Model loaders by name. A model preset names its loader; the loader builds a DiffusionModel."""

from __future__ import annotations

import torch

from solrl_core.config import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel

__all__ = ["Conditioning", "DiffusionModel", "load_model"]


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> DiffusionModel:
    if cfg.loader == "tiny":
        from solrl_core.models.tiny import build_tiny

        return build_tiny(cfg, device, dtype)
    if cfg.loader in ("sana", "flux1", "sd3"):
        raise SolrlError(f"loading the real '{cfg.loader}' model ({cfg.hub_id}) is not available in this version of solrl",
                         "train the built-in tiny model (--model tiny) for now; its config can be inspected with --dump-config")
    raise SolrlError(f"unknown model loader '{cfg.loader}'", "model.loader must be one of: tiny, sana, flux1, sd3")
