"""What the engine needs from a text-to-image flow model, whatever its architecture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass(frozen=True)
class Conditioning:
    """Text conditioning of a batch: token embeddings, their attention mask, and (FLUX, SD3) the
    pooled text embedding."""

    embeds: torch.Tensor  # [B, L, D]
    mask: torch.Tensor  # [B, L]
    pooled: torch.Tensor | None = None  # [B, P]

    def __getitem__(self, index: torch.Tensor | slice | list[int]) -> "Conditioning":
        return Conditioning(self.embeds[index], self.mask[index], None if self.pooled is None else self.pooled[index])

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "Conditioning":
        pooled = None if self.pooled is None else self.pooled.to(device=device, dtype=dtype or self.pooled.dtype)
        return Conditioning(self.embeds.to(device=device, dtype=dtype or self.embeds.dtype), self.mask.to(device),
                            pooled)

    @staticmethod
    def cat(parts: list["Conditioning"]) -> "Conditioning":
        pooled = None if parts[0].pooled is None else torch.cat([p.pooled for p in parts])  # type: ignore[misc]
        return Conditioning(torch.cat([p.embeds for p in parts]), torch.cat([p.mask for p in parts]), pooled)


# velocity(module, latents [B,C,H,W] (video: [B,C,F,H,W]), sigmas [B], cond) -> predicted flow velocity (noise - x0)
VelocityFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, Conditioning], torch.Tensor]


@dataclass
class DiffusionModel:
    """A loaded model: the transformer the policy adapts, plus the pieces around it."""

    transformer: nn.Module
    encode: Callable[[list[str]], Conditioning]
    # latents -> images [B,3,H,W] (a video model: clips [B,F,3,H,W]) in [0,1]
    decode: Callable[[torch.Tensor], torch.Tensor]
    velocity: VelocityFn
    latent_shape: tuple[int, int, int]
    description: str
    vocabulary: tuple[str, ...] = ()  # the words its text encoder knows (others are dropped); () = any text
    frames: int = 0  # 0: an image model (decode gives [B, 3, H, W]); a video model's frames per clip ([B, F, 3, H, W])
    # the VAE `decode` runs (None: the tiny model decodes without one); memory.vae_on_cpu parks it
    vae: nn.Module | None = None

    @property
    def media(self) -> str:
        """What its samples are, as a reward declares what it judges (rewards/registry.py): image or video."""
        return "video" if self.frames else "image"


def sana_velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    """SANA's transformer takes timesteps on the 0..1000 scale and predicts the velocity directly."""
    return module(
        hidden_states=latents,
        encoder_hidden_states=cond.embeds.to(latents.dtype),
        timestep=sigmas.float() * 1000.0,
        encoder_attention_mask=cond.mask,
        return_dict=False,
    )[0]
