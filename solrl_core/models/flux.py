"""FLUX.1 (FluxTransformer2DModel, CLIP-L + T5-XXL, AutoencoderKL) as a DiffusionModel.

`latent_shape` is the unpacked VAE latent [16, H/8, W/8], so seeded noise, the sampler and the
training loss stay generic; `velocity` packs 2x2 patches into tokens, adds the image and text
position ids and unpacks the prediction, as FluxPipeline does. The transformer takes the timestep
as sigma (FluxPipeline passes timestep / 1000) and, for guidance-distilled checkpoints
(FLUX.1-dev: `guidance_embeds`), a guidance value fixed at 1.0 (Sol-RL samples without guidance).
Prompts: CLIP pooled output plus T5 token embeddings at `model.max_sequence_length` tokens (the
preset's 128, as the official train_flux1.py:94 TEXT_ENCODER_MAX_SEQ_LEN; 0: FluxPipeline's 512), via
FluxPipeline's own `encode_prompt`; FLUX uses no text attention mask, so the mask is all ones.
"""

from __future__ import annotations

import torch
from torch import nn

from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.diffusers_models import Components, TextEncoders, scaled_decode

MAX_SEQUENCE_LENGTH = 512  # FluxPipeline's default, for model.max_sequence_length = 0
GUIDANCE = 1.0


def build_flux(parts: Components) -> DiffusionModel:
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    transformer = parts.transformer(FluxTransformer2DModel)
    vae = parts.vae(AutoencoderKL)
    text_encoder, text_encoder_2 = parts.model(CLIPTextModel, "text_encoder"), parts.model(T5EncoderModel,
                                                                                           "text_encoder_2")
    pipe = FluxPipeline(scheduler=None, vae=None, transformer=None, text_encoder=text_encoder,
                        text_encoder_2=text_encoder_2,
                        tokenizer=parts.tokenizer("tokenizer"), tokenizer_2=parts.tokenizer("tokenizer_2"))
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    side = parts.latent_side(factor * 2, factor)  # 2x2 packing
    channels = vae.config.latent_channels
    latent_shape = (channels, side, side)
    encoders = TextEncoders([text_encoder, text_encoder_2], parts.device)
    tokens = parts.cfg.max_sequence_length or MAX_SEQUENCE_LENGTH

    def encode(prompts: list[str]) -> Conditioning:
        with encoders.on_device():
            embeds, pooled, _ = pipe.encode_prompt(prompts, device=parts.device, max_sequence_length=tokens)
        mask = torch.ones(embeds.shape[:2], dtype=torch.long)
        return Conditioning(embeds.cpu(), mask, pooled.cpu())

    return DiffusionModel(transformer=transformer, encode=encode, vae=vae, decode=scaled_decode(vae, parts.device),
                          velocity=flux_velocity_fn(bool(transformer.config.guidance_embeds)),
                          latent_shape=latent_shape, description=parts.describe("FLUX.1", transformer, latent_shape))


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H/2 * W/2, 4C] (FluxPipeline._pack_latents)."""
    b, c, h, w = latents.shape
    return latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of `pack` (FluxPipeline._unpack_latents)."""
    b, _, d = tokens.shape
    return tokens.view(b, h // 2, w // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, d // 4, h, w)


def image_ids(h: int, w: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[h/2 * w/2, 3] position ids (0, row, column) of the packed tokens."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] += torch.arange(h // 2)[:, None]
    ids[..., 2] += torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3).to(device=device, dtype=dtype)


def flux_velocity_fn(guidance_embeds: bool):  # type: ignore[no-untyped-def]
    def velocity(module: nn.Module, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        b, _, h, w = latents.shape
        dtype, device = latents.dtype, latents.device
        guidance = torch.full((b,), GUIDANCE, device=device, dtype=torch.float32) if guidance_embeds else None
        out = module(hidden_states=pack(latents), timestep=sigmas.to(dtype), guidance=guidance,
                     pooled_projections=cond.pooled.to(dtype), encoder_hidden_states=cond.embeds.to(dtype),
                     txt_ids=torch.zeros(cond.embeds.shape[1], 3, device=device, dtype=dtype),
                     img_ids=image_ids(h, w, device, dtype), return_dict=False)[0]
        return unpack(out, h, w)

    return velocity
