"""Stable Diffusion 3 / 3.5 (SD3Transformer2DModel, CLIP-L + CLIP-G + T5-XXL, AutoencoderKL).

Prompts are encoded by StableDiffusion3Pipeline's own `encode_prompt`: the two CLIP penultimate
hidden states concatenated and zero-padded to T5's width, followed by T5's tokens at
`model.max_sequence_length` (the preset's 128, as the official train_sd3.py:81 TEXT_ENCODER_MAX_SEQ_LEN;
0: the pipeline's 256); pooled = both CLIP projections concatenated. SD3 uses no text attention
mask (all ones here). The transformer takes timesteps on the 0..1000 scale (sigma * 1000), as the
pipeline passes them. Latents: the VAE's 16 channels at H/8, shifted and scaled by its factors.
"""

from __future__ import annotations

import torch
from torch import nn

from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.diffusers_models import Components, TextEncoders, scaled_decode

MAX_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline's default, for model.max_sequence_length = 0


def build_sd3(parts: Components) -> DiffusionModel:
    from diffusers import AutoencoderKL, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    transformer = parts.transformer(SD3Transformer2DModel)
    vae = parts.vae(AutoencoderKL)
    encoders = [parts.model(CLIPTextModelWithProjection, "text_encoder"),
                parts.model(CLIPTextModelWithProjection, "text_encoder_2"),
                parts.model(T5EncoderModel, "text_encoder_3")]
    pipe = StableDiffusion3Pipeline(
        transformer=None, scheduler=None, vae=None,
        text_encoder=encoders[0], tokenizer=parts.tokenizer("tokenizer"),
        text_encoder_2=encoders[1], tokenizer_2=parts.tokenizer("tokenizer_2"),
        text_encoder_3=encoders[2], tokenizer_3=parts.tokenizer("tokenizer_3"))
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    side = parts.latent_side(factor * transformer.config.patch_size, factor)
    latent_shape = (transformer.config.in_channels, side, side)
    on_device = TextEncoders(encoders, parts.device).on_device

    def encode(prompts: list[str]) -> Conditioning:
        with on_device():
            embeds, _, pooled, _ = pipe.encode_prompt(prompts, prompt_2=None, prompt_3=None, device=parts.device,
                                                      do_classifier_free_guidance=False,
                                                      max_sequence_length=parts.cfg.max_sequence_length
                                                      or MAX_SEQUENCE_LENGTH)
        mask = torch.ones(embeds.shape[:2], dtype=torch.long)
        return Conditioning(embeds.cpu(), mask, pooled.cpu())

    return DiffusionModel(transformer=transformer, encode=encode, vae=vae, decode=scaled_decode(vae, parts.device),
                          velocity=sd3_velocity,
                          latent_shape=latent_shape, description=parts.describe("SD3", transformer, latent_shape))


def sd3_velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    dtype = latents.dtype
    return module(hidden_states=latents, timestep=sigmas.float() * 1000.0, encoder_hidden_states=cond.embeds.to(dtype),
                  pooled_projections=cond.pooled.to(dtype), return_dict=False)[0]
