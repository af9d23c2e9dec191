"""FLUX.2 [klein] (Flux2Transformer2DModel, Qwen3 text encoder, AutoencoderKLFlux2).

Prompts are encoded by Flux2KleinPipeline's own `encode_prompt`: the tokenizer's chat template
(enable_thinking off), padding to max_sequence_length 512, and the hidden states of layers 9, 18 and
27 stacked along the width. FLUX.2 passes no text attention mask, so the mask is all ones.

`latent_shape` is the pipeline's own latent space: the VAE latent cut into 2x2 patches
([4 x latent_channels, H/16, W/16]) and normalised by the VAE's batch-norm running statistics,
which is where the pipeline draws its noise. `velocity` flattens it into row-major tokens with the
(t, h, w, l) position ids of Flux2KleinPipeline._prepare_latent_ids and the text ids of
_prepare_text_ids, and passes the timestep as sigma (the pipeline's timestep / 1000) with no
guidance embedding (the klein models are step-distilled and sample without CFG). `decode`
undoes the normalisation and the patching before the VAE, as the pipeline does.
"""

from __future__ import annotations

import torch
from torch import nn

from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.diffusers_models import Components, TextEncoders, chunked_decode

MAX_SEQUENCE_LENGTH = 512  # Flux2KleinPipeline.__call__'s default


def build_flux2(parts: Components) -> DiffusionModel:
    from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen3ForCausalLM

    transformer = parts.transformer(Flux2Transformer2DModel)
    vae = parts.vae(AutoencoderKLFlux2)
    text_encoder = parts.model(Qwen3ForCausalLM, "text_encoder")
    pipe = Flux2KleinPipeline(scheduler=None, vae=None, transformer=None, text_encoder=text_encoder,
                              tokenizer=parts.tokenizer("tokenizer"))
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    side = parts.latent_side(factor * 2, factor) // 2  # the pipeline's 2x2 patches of the VAE latent
    latent_shape = (transformer.config.in_channels, side, side)
    encoders = TextEncoders([text_encoder], parts.device)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)

    def encode(prompts: list[str]) -> Conditioning:
        with encoders.on_device():
            embeds, _ = pipe.encode_prompt(list(prompts), device=parts.device, max_sequence_length=MAX_SEQUENCE_LENGTH)
        return Conditioning(embeds.cpu(), torch.ones(embeds.shape[:2], dtype=torch.long))

    def vae_decode(z: torch.Tensor) -> torch.Tensor:
        z = z.to(parts.device, vae.dtype)
        z = Flux2KleinPipeline._unpatchify_latents(z * std.to(z.device, z.dtype) + mean.to(z.device, z.dtype))
        return vae.decode(z, return_dict=False)[0]

    return DiffusionModel(transformer=transformer, encode=encode, vae=vae,
                          decode=lambda latents: chunked_decode(vae_decode, latents),
                          velocity=flux2_velocity, latent_shape=latent_shape,
                          description=parts.describe("FLUX.2 [klein]", transformer, latent_shape))


def flux2_velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    from diffusers import Flux2KleinPipeline

    b, c, h, w = latents.shape
    dtype, device = latents.dtype, latents.device
    embeds = cond.embeds.to(device, dtype)
    out = module(hidden_states=latents.reshape(b, c, h * w).permute(0, 2, 1), timestep=sigmas.to(dtype), guidance=None,
                 encoder_hidden_states=embeds, txt_ids=Flux2KleinPipeline._prepare_text_ids(embeds).to(device),
                 img_ids=Flux2KleinPipeline._prepare_latent_ids(latents).to(device), return_dict=False)[0]
    return out.permute(0, 2, 1).reshape(b, c, h, w)
