"""Wan 2.1 text-to-video (WanTransformer3DModel, UMT5-XXL text encoder, AutoencoderKLWan).

Prompts are encoded by WanPipeline's own `encode_prompt` at the max_sequence_length its `__call__`
uses (512): the UMT5 last hidden state of the valid tokens, zero-padded to 512. Wan passes no text
mask to its transformer (the zero rows are attended to), so the mask here is all ones and the
padding is kept: it changes the velocity, as in the pipeline.

`latent_shape` is the pipeline's latent [z_dim, 1 + (frames - 1) / 4, H / 8, W / 8] (the VAE's
temporal and spatial scale factors), where the pipeline draws its noise; the sampler, the loss and
the copies treat the frame axis as one more latent axis. `velocity` passes the timestep as
sigma * 1000, one per clip, as WanPipeline does for Wan 2.1; for Wan 2.2 TI2V 5B, whose
model_index.json sets `expand_timesteps`, one per latent token (all equal in text-to-video, as the
pipeline's all-ones mask makes them). Wan predicts the flow velocity noise - x0 natively. `decode` undoes the latents'
normalisation (latents_mean and
latents_std) as the pipeline does and returns clips [B, F, 3, H, W] in [0, 1]: frames first, so a
clip's frames are ordinary images to every image reward (rewards/video.py).
"""

from __future__ import annotations

import json

import torch
from torch import nn

from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.diffusers_models import Components, TextEncoders

MAX_SEQUENCE_LENGTH = 512  # WanPipeline.__call__'s default
DECODE_CLIPS = 1  # clips per VAE decode call: a clip holds every frame's activations


def build_wan(parts: Components) -> DiffusionModel:
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
    from transformers import UMT5EncoderModel

    transformer = parts.transformer(WanTransformer3DModel)
    vae = parts.vae(AutoencoderKLWan)
    text_encoder = parts.model(UMT5EncoderModel, "text_encoder")
    pipe = WanPipeline(tokenizer=parts.tokenizer("tokenizer"), text_encoder=text_encoder, vae=None, transformer=None,
                       scheduler=None)
    temporal, spatial = vae.config.scale_factor_temporal, vae.config.scale_factor_spatial
    side = parts.latent_side(spatial * transformer.config.patch_size[1], spatial)
    latent_shape = (vae.config.z_dim, latent_frames(parts.cfg.frames, temporal), side, side)
    encoders = TextEncoders([text_encoder], parts.device)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)

    def encode(prompts: list[str]) -> Conditioning:
        with encoders.on_device():
            embeds, _ = pipe.encode_prompt(list(prompts), do_classifier_free_guidance=False,
                                           max_sequence_length=MAX_SEQUENCE_LENGTH, device=parts.device)
        return Conditioning(embeds.cpu(), torch.ones(embeds.shape[:2], dtype=torch.long))

    def decode(latents: torch.Tensor) -> torch.Tensor:
        out = []
        with torch.no_grad():
            for start in range(0, latents.shape[0], DECODE_CLIPS):
                z = latents[start:start + DECODE_CLIPS].to(parts.device, vae.dtype)
                z = z * std.to(z.device, z.dtype) + mean.to(z.device, z.dtype)
                clips = vae.decode(z, return_dict=False)[0]  # [B, 3, F, H, W] in [-1, 1]
                out.append((clips.float() / 2 + 0.5).clamp(0.0, 1.0).permute(0, 2, 1, 3, 4))
        return torch.cat(out)

    description = parts.describe("Wan", transformer, latent_shape) + f", {parts.cfg.frames} frames"
    per_token = json.loads((parts.folder / "model_index.json").read_text()).get("expand_timesteps", False)
    return DiffusionModel(transformer=transformer, encode=encode, vae=vae, decode=decode,
                          velocity=wan22_velocity if per_token else wan_velocity,
                          latent_shape=latent_shape, description=description, frames=parts.cfg.frames)


def latent_frames(frames: int, temporal: int) -> int:
    """Latent frames of a clip of `frames` frames: the first frame alone, then one per `temporal`."""
    if frames < 1 or (frames - 1) % temporal:
        raise SolrlError(f"model.frames={frames} does not fit the Wan VAE, which keeps the first frame and then "
                         f"compresses every {temporal} frames into one",
                         f"use 1 + a multiple of {temporal} frames, e.g. --set "
                         f"model.frames={1 + temporal * max(1, (frames - 1) // temporal)}")
    return 1 + (frames - 1) // temporal


def wan_velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    return module(hidden_states=latents, timestep=sigmas.float() * 1000.0,
                  encoder_hidden_states=cond.embeds.to(latents.dtype), return_dict=False)[0]


def wan22_velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    """Wan 2.2 TI2V: one timestep per latent token (frames x 2x2 patches), as WanPipeline passes them
    with `expand_timesteps`."""
    b, _, f, h, w = latents.shape
    tokens = f * (h // 2) * (w // 2)
    timestep = (sigmas.float() * 1000.0)[:, None].expand(b, tokens)
    return module(hidden_states=latents, timestep=timestep, encoder_hidden_states=cond.embeds.to(latents.dtype),
                  return_dict=False)[0]
