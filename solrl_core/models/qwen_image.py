"""Qwen-Image (QwenImageTransformer2DModel, Qwen2.5-VL text encoder, AutoencoderKLQwenImage).

Prompts are encoded by QwenImagePipeline's own `encode_prompt` (its chat template, the template's
first 34 tokens dropped, the last hidden state of the valid tokens) at the max_sequence_length its
`__call__` uses (512), then zero-padded to that length with mask 0 so that separately encoded
prompts batch together. `velocity` trims a batch back to its longest prompt and passes the mask
only when some token is padding, as the pipeline does for prompts encoded together; the transformer
masks padded text tokens out of its joint attention, so the padding changes nothing.

`latent_shape` is the VAE latent [z_dim, H/8, W/8] without the video frame axis; `velocity` packs
2x2 patches into tokens (as FluxPipeline, QwenImagePipeline._pack_latents) and passes the image
shape and the timestep as sigma (the pipeline's timestep / 1000). Qwen-Image predicts the flow
velocity noise - x0 natively. `decode` unnormalises with the VAE's latents_mean / latents_std and
keeps the single frame, as the pipeline does. Qwen-Image has no guidance embedding (guidance=None).
"""

from __future__ import annotations

import torch
from torch import nn

from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.diffusers_models import Components, TextEncoders, chunked_decode, trim_padding
from solrl_core.models.flux import pack, unpack

MAX_SEQUENCE_LENGTH = 512  # QwenImagePipeline.__call__'s default


def build_qwen_image(parts: Components) -> DiffusionModel:
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    transformer = parts.transformer(QwenImageTransformer2DModel)
    vae = parts.vae(AutoencoderKLQwenImage)
    text_encoder = parts.model(Qwen2_5_VLForConditionalGeneration, "text_encoder")
    pipe = QwenImagePipeline(scheduler=None, vae=None, transformer=None, text_encoder=text_encoder,
                             tokenizer=parts.tokenizer("tokenizer"))
    factor = 2 ** len(vae.temperal_downsample)
    side = parts.latent_side(factor * 2, factor)  # 2x2 packing
    latent_shape = (vae.config.z_dim, side, side)
    encoders = TextEncoders([text_encoder], parts.device)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)

    def encode(prompts: list[str]) -> Conditioning:
        with encoders.on_device():
            embeds, mask = pipe.encode_prompt(prompts, device=parts.device, max_sequence_length=MAX_SEQUENCE_LENGTH)
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        pad = MAX_SEQUENCE_LENGTH - embeds.shape[1]
        embeds = torch.nn.functional.pad(embeds, (0, 0, 0, pad))
        return Conditioning(embeds.cpu(), torch.nn.functional.pad(mask, (0, pad)).cpu())

    def vae_decode(z: torch.Tensor) -> torch.Tensor:
        z = z.to(parts.device, vae.dtype)[:, :, None]
        z = z * std.to(z.device, z.dtype) + mean.to(z.device, z.dtype)
        return vae.decode(z, return_dict=False)[0][:, :, 0]

    return DiffusionModel(transformer=transformer, encode=encode, vae=vae,
                          decode=lambda latents: chunked_decode(vae_decode, latents),
                          velocity=qwen_image_velocity, latent_shape=latent_shape,
                          description=parts.describe("Qwen-Image", transformer, latent_shape))


def qwen_image_velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor,
                        cond: Conditioning) -> torch.Tensor:
    b, _, h, w = latents.shape
    dtype = latents.dtype
    embeds, mask = trim_padding(cond)
    out = module(hidden_states=pack(latents), timestep=sigmas.to(dtype), guidance=None,
                 encoder_hidden_states=embeds.to(dtype), encoder_hidden_states_mask=None if bool(mask.all()) else mask,
                 img_shapes=[[(1, h // 2, w // 2)]] * b, return_dict=False)[0]
    return unpack(out, h, w)
