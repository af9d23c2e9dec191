"""Every real model solrl loads, by loader name: which subfolders of a diffusers folder it needs,
whether its hub repo is gated, the function that builds it, and the diffusers pipeline whose LoRA
format its adapters follow. A model preset names its loader (`model.loader`)."""

from __future__ import annotations

from solrl_core.models.diffusers_models import Layout
from solrl_core.models.flux import build_flux
from solrl_core.models.flux2 import build_flux2
from solrl_core.models.qwen_image import build_qwen_image
from solrl_core.models.sana import build_sana
from solrl_core.models.sd3 import build_sd3
from solrl_core.models.wan import build_wan
from solrl_core.models.zimage import build_zimage

LAYOUTS = {
    "sana": Layout("SANA", ("transformer", "vae", "text_encoder"), ("tokenizer",), gated=False,
                   builder=build_sana, pipeline="SanaPipeline"),
    "flux1": Layout("FLUX.1", ("transformer", "vae", "text_encoder", "text_encoder_2"), ("tokenizer", "tokenizer_2"),
                    gated=True, builder=build_flux, pipeline="FluxPipeline"),
    "sd3": Layout("SD3", ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"),
                  ("tokenizer", "tokenizer_2", "tokenizer_3"), gated=True, builder=build_sd3,
                  pipeline="StableDiffusion3Pipeline"),
    "qwen_image": Layout("Qwen-Image", ("transformer", "vae", "text_encoder"), ("tokenizer",), gated=False,
                         builder=build_qwen_image, pipeline="QwenImagePipeline"),
    "zimage": Layout("Z-Image", ("transformer", "vae", "text_encoder"), ("tokenizer",), gated=False,
                     builder=build_zimage, pipeline="ZImagePipeline"),
    "flux2": Layout("FLUX.2 [klein]", ("transformer", "vae", "text_encoder"), ("tokenizer",), gated=False,
                    builder=build_flux2, pipeline="Flux2KleinPipeline"),
    "wan": Layout("Wan", ("transformer", "vae", "text_encoder"), ("tokenizer",), gated=False, builder=build_wan,
                  pipeline="WanPipeline"),
}
