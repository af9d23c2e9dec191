"""SANA (SanaTransformer2DModel, DC-AE, Gemma2 text encoder) as a DiffusionModel.

Prompts are encoded by diffusers' SanaPipeline's own `encode_prompt` as the official Sol-RL code
calls it (NVlabs/Sana diffusion/post_training/diffusers_patch/text_encode.py, `encode_sana_prompt`):
no complex human instruction, max_sequence_length 300, with the attention mask. `model.prompt_instruction`
prefixes the instruction that `SanaPipeline.__call__` uses by default (the first token plus the last
299 then kept), for users who sample their model through the pipeline's defaults. Latents are the DC-AE's
`latent_channels` at resolution / 32 (for the
released models), scaled by the VAE's scaling factor as the pipeline does.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.diffusers_models import Components, TextEncoders, scaled_decode

MAX_SEQUENCE_LENGTH = 300


def build_sana(parts: Components) -> DiffusionModel:
    from diffusers import AutoencoderDC, SanaPipeline, SanaTransformer2DModel
    from transformers import AutoModel

    transformer = parts.transformer(SanaTransformer2DModel)
    vae = parts.vae(AutoencoderDC)
    text_encoder = parts.model(AutoModel, "text_encoder")
    tokenizer = parts.tokenizer("tokenizer")
    config = transformer.config
    factor = 2 ** (len(vae.config.encoder_block_out_channels) - 1)
    side = parts.latent_side(factor * config.patch_size, factor)
    latent_shape = (config.in_channels, side, side)
    # The pipeline object is only a holder for its prompt encoding; it owns no sampling here.
    pipe = SanaPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=None, transformer=None, scheduler=None)
    instruction = None
    if parts.cfg.prompt_instruction:
        instruction = inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default
    encoders = TextEncoders([text_encoder], parts.device)

    def encode(prompts: list[str]) -> Conditioning:
        with encoders.on_device():
            embeds, mask, _, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False, device=parts.device,
                                                    max_sequence_length=MAX_SEQUENCE_LENGTH,
                                                    complex_human_instruction=instruction)
        return Conditioning(embeds.cpu(), mask.cpu())

    return DiffusionModel(transformer=transformer, encode=encode, vae=vae, decode=scaled_decode(vae, parts.device),
                          velocity=sana_velocity_fn(config.timestep_scale, config.in_channels, config.out_channels),
                          latent_shape=latent_shape, description=parts.describe("SANA", transformer, latent_shape))


def sana_velocity_fn(timestep_scale: float, in_channels: int, out_channels: int):  # type: ignore[no-untyped-def]
    """SANA's transformer call as SanaPipeline makes it: timestep sigma * 1000 * timestep_scale; a
    learned-sigma head (out_channels = 2 x in_channels) keeps its first half."""

    def velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        out = module(hidden_states=latents, encoder_hidden_states=cond.embeds.to(latents.dtype),
                     timestep=sigmas.float() * (1000.0 * timestep_scale),
                     encoder_attention_mask=cond.mask, return_dict=False)[0]
        if out_channels // 2 == in_channels:
            out = out[:, :in_channels]
        return out

    return velocity
