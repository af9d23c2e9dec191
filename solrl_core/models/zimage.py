"""Z-Image (ZImageTransformer2DModel, Qwen3 text encoder, AutoencoderKL).

Prompts are encoded by ZImagePipeline's own `encode_prompt` (the tokenizer's chat template with
enable_thinking, padding to max_sequence_length 512, the second-to-last hidden state of the valid
tokens), which returns one variable-length embedding per prompt; here they are zero-padded to 512
with a mask, and `velocity` hands the transformer the valid tokens of each prompt as a list again,
exactly what the pipeline passes.

The transformer takes a list of [C, 1, H, W] latents (a frame axis of one), its timestep as
1 - sigma (the pipeline's (1000 - t) / 1000) and predicts x0 - noise: `velocity` negates it, as the
pipeline does before its scheduler step. Latents: the VAE's 16 channels at H/8, shifted and scaled
by its factors.
"""

from __future__ import annotations

import torch
from torch import nn

from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.diffusers_models import Components, TextEncoders, scaled_decode

MAX_SEQUENCE_LENGTH = 512  # ZImagePipeline.__call__'s default


def build_zimage(parts: Components) -> DiffusionModel:
    from diffusers import AutoencoderKL, ZImagePipeline, ZImageTransformer2DModel
    from transformers import AutoModel

    transformer = parts.transformer(ZImageTransformer2DModel)
    vae = parts.vae(AutoencoderKL)
    text_encoder = parts.model(AutoModel, "text_encoder")
    pipe = ZImagePipeline(scheduler=None, vae=None, transformer=None, text_encoder=text_encoder,
                          tokenizer=parts.tokenizer("tokenizer"))
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    side = parts.latent_side(factor * 2, factor)  # the transformer's 2x2 patches
    latent_shape = (transformer.config.in_channels, side, side)
    encoders = TextEncoders([text_encoder], parts.device)

    def encode(prompts: list[str]) -> Conditioning:
        with encoders.on_device():  # encode_prompt rewrites the list it is given: pass a copy
            embeds, _ = pipe.encode_prompt(list(prompts), device=parts.device, do_classifier_free_guidance=False,
                                           max_sequence_length=MAX_SEQUENCE_LENGTH)
        padded = embeds[0].new_zeros(len(embeds), MAX_SEQUENCE_LENGTH, embeds[0].shape[-1])
        mask = torch.zeros(len(embeds), MAX_SEQUENCE_LENGTH, dtype=torch.long)
        for i, e in enumerate(embeds):
            padded[i, :len(e)], mask[i, :len(e)] = e, 1
        return Conditioning(padded.cpu(), mask)

    return DiffusionModel(transformer=transformer, encode=encode, vae=vae, decode=scaled_decode(vae, parts.device),
                          velocity=zimage_velocity,
                          latent_shape=latent_shape, description=parts.describe("Z-Image", transformer, latent_shape))


def zimage_velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    dtype = latents.dtype
    mask = cond.mask.to(cond.embeds.device).bool()
    captions = [cond.embeds[i][mask[i]].to(dtype) for i in range(latents.shape[0])]
    out = module(list(latents.unsqueeze(2).unbind(0)), (1.0 - sigmas).to(dtype), captions, return_dict=False)[0]
    return -torch.stack(out).squeeze(2).to(dtype)
