"""Random-weight pipelines of the model presets' transformers, saved in the hub's diffusers layout so
that `solrl train` loads them through its own code, with no download.

At `size="real"` the transformer has its published configuration (the hub's transformer/config.json);
the text encoders are one- or two-layer models of the real output widths (Gemma2 2304; CLIP-L 768,
CLIP-G 1280, T5-XXL 4096) and the VAE has two blocks and the real latent channels. The VAE compresses
2x where the real one compresses 8x (32x for SANA's DC-AE), so the bench renders at the resolution that
gives the real latent: SANA 1024 px -> 64 px here, both 32x32x32; FLUX.1 512 px -> 128 px, both
64x64x16 (1024 image tokens); SD3.5-L 1024 px -> 256 px, both 128x128x16 (4096 tokens). The transformer,
the part the bench measures, sees exactly the real shapes. `size="tiny"` keeps each architecture with
small widths, for a CPU. The Wan video presets (loader "wan") are built the same way by bench/video.py,
whose docstring gives their VAE's arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from solrl_core.bench import encoders as enc
from solrl_core.bench import video
from solrl_core.errors import SolrlError

# Published transformer configurations by model preset, and tiny ones of the same structure by loader.
REAL = {
    "sana": dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32, num_layers=20,
                 num_cross_attention_heads=20, cross_attention_head_dim=112, cross_attention_dim=2240,
                 caption_channels=2304, mlp_ratio=2.5, sample_size=32, patch_size=1),
    "flux1": dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                  axes_dims_rope=(16, 56, 56)),
    "sd3": dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                num_attention_heads=38,
                joint_attention_dim=4096, caption_projection_dim=2432, pooled_projection_dim=2048, out_channels=16,
                qk_norm="rms_norm", pos_embed_max_size=192),
}
TINY = {
    "sana": dict(in_channels=32, out_channels=32, num_attention_heads=2, attention_head_dim=16, num_layers=2,
                 num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32, caption_channels=32,
                 mlp_ratio=2.5, sample_size=8, patch_size=1),
    "flux1": dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
                  num_attention_heads=2,
                  joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 4, 8)),
    "sd3": dict(sample_size=16, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4,
                joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=64, out_channels=16,
                qk_norm="rms_norm", pos_embed_max_size=24),
}
REAL_VAE_FACTOR = {"sana": 32, "flux1": 8, "sd3": 8}  # the released VAEs' spatial compression

BENCH_VAE_FACTOR = 2  # the two-block VAEs of encoders.py
# The released AutoencoderKLs' configurations (vae/config.json of black-forest-labs/FLUX.1-dev and
# stabilityai/stable-diffusion-3.5-large): 8x compression, 16 latent channels, 84M parameters.
PUBLISHED_VAES = {"flux1": dict(scaling_factor=0.3611, shift_factor=0.1159),
                  "sd3": dict(scaling_factor=1.5305, shift_factor=0.0609)}
TINY_REAL_VAE_RESOLUTION = 64  # a tiny transformer under the published VAE: an 8x8 latent, for a CPU
TINY_RESOLUTION = 32
SIZES = ("real", "tiny")


@dataclass(frozen=True)
class BenchModel:
    """What the bench builds for one model preset at one size."""

    preset: str
    loader: str
    size: str
    transformer: dict[str, Any]  # the transformer's config
    resolution: int  # the resolution the bench renders at (gives the real latent at size "real")
    real_vae: bool = False  # the VAE of the published config (random weights) instead of the two-block one
    frames: int = 0  # frames per clip of a video model (0: an image model)

    @property
    def vae_factor(self) -> int:
        """The spatial compression of the VAE the bench builds."""
        if self.loader == "wan":
            return video.bench_vae_factor(self.preset)
        return REAL_VAE_FACTOR[self.loader] if self.real_vae else BENCH_VAE_FACTOR

    @property
    def latent_side(self) -> int:
        return self.resolution // self.vae_factor


MODELS_HINT = "use --model sana, flux1, sd3, wan21_t2v_1_3b, wan21_t2v_14b or wan22_ti2v_5b"


def bench_model(preset: str, loader: str, resolution: int, size: str, real_vae: bool = False,
                frames: int = 0) -> BenchModel:
    """The transformer config and render resolution of `preset` (its loader, configured resolution and,
    for a video model, frames); `real_vae`: with the VAE of the published config, at the preset's own
    resolution (a tiny model: 64 px)."""
    if real_vae and loader not in PUBLISHED_VAES:
        raise SolrlError(f"--real-vae builds the published VAE of {', '.join(PUBLISHED_VAES)}; none is recorded for "
                         f"the {preset} preset's {loader} "
                         f"loader", "leave --real-vae out: the bench's small VAE gives the real latent")
    if real_vae:
        side = TINY_REAL_VAE_RESOLUTION if size == "tiny" else resolution
        model = bench_model(preset, loader, resolution, size)
        return BenchModel(preset, loader, size, model.transformer, side, real_vae=True)
    if size not in SIZES:
        raise SolrlError(f"--size {size}: expected real or tiny",
                         "use --size real (a GPU) or --size tiny (any machine)")
    if loader == "wan":
        if size == "real" and preset not in video.VIDEO_REAL:
            raise SolrlError(f"no published transformer size recorded for the {preset} preset", f"{MODELS_HINT}, or "
                                                                                                f"--size "
                             "tiny for a Wan-architecture model of tiny width")
        return BenchModel(preset, loader, size, video.wan_transformer_config(preset, size),
                          video.wan_bench_resolution(preset, resolution, size), frames=frames)
    if loader not in TINY:
        raise SolrlError(f"solrl bench builds sana, flux1, sd3 and Wan models; the {preset} preset's loader is "
                         f"{loader}",
                         MODELS_HINT)
    if size == "tiny":
        return BenchModel(preset, loader, size, TINY[loader], TINY_RESOLUTION)
    if preset not in REAL:
        raise SolrlError(f"no published transformer size recorded for the {preset} preset", f"{MODELS_HINT}, "
                         f"or --size tiny for a {loader}-architecture model of tiny width")
    return BenchModel(preset, loader, size, REAL[preset], resolution // REAL_VAE_FACTOR[loader] * BENCH_VAE_FACTOR)


def transformer_class(loader: str) -> type:
    from diffusers import FluxTransformer2DModel, SanaTransformer2DModel, SD3Transformer2DModel, WanTransformer3DModel

    return {"sana": SanaTransformer2DModel, "flux1": FluxTransformer2DModel, "sd3": SD3Transformer2DModel,
            "wan": WanTransformer3DModel}[loader]


def build_transformer(model: BenchModel, device: torch.device | str,
                      dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """The random-init transformer, created on `device` in `dtype` (a 12B model is minutes in fp32 on a CPU)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return transformer_class(model.loader)(**model.transformer).eval()
    finally:
        torch.set_default_dtype(default)


def build_pipeline(model: BenchModel, folder: Path, device: torch.device | str = "cpu") -> Path:
    """Save the random-init pipeline of `model` into `folder` (diffusers layout); the transformer is
    initialised on `device` in bf16 and saved from the CPU."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    torch.manual_seed(0)
    transformer = build_transformer(model, device).to("cpu")
    real = model.size == "real"
    if model.loader == "wan":
        pipe = video.bench_wan_pipeline(model.preset, transformer)
    elif model.loader == "sana":
        from diffusers import SanaPipeline

        tok = enc.gemma_tokenizer()
        width = model.transformer["caption_channels"]
        pipe = SanaPipeline(tokenizer=tok, text_encoder=enc.gemma_encoder(tok, width, 256 if real else 16),
                            vae=enc.dc_vae(model.transformer["in_channels"]), transformer=transformer,
                            scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0))
    elif model.loader == "flux1":
        from diffusers import FluxPipeline

        tok, tok2 = enc.clip_tokenizer(), enc.t5_tokenizer()
        pooled = model.transformer["pooled_projection_dim"]
        vae = (enc.published_kl_vae(**PUBLISHED_VAES["flux1"]) if model.real_vae
               else enc.kl_vae(model.transformer["in_channels"] // 4))
        pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                            transformer=transformer,
                            text_encoder=enc.clip_encoder(tok, pooled, pooled, with_projection=False),
                            tokenizer=tok,
                            text_encoder_2=enc.t5_encoder(tok2, model.transformer["joint_attention_dim"]),
                            tokenizer_2=tok2)
    else:
        from diffusers import StableDiffusion3Pipeline

        toks = enc.clip_tokenizer(), enc.clip_tokenizer(), enc.t5_tokenizer()
        clip_l, clip_g = (768, 1280) if real else (16, 16)
        proj_l, proj_g = (768, 1280) if real else (32, 32)
        pipe = StableDiffusion3Pipeline(
            transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            vae=enc.published_kl_vae(**PUBLISHED_VAES["sd3"]) if model.real_vae
                                        else enc.kl_vae(model.transformer["in_channels"]),
            tokenizer=toks[0], tokenizer_2=toks[1], tokenizer_3=toks[2],
            text_encoder=enc.clip_encoder(toks[0], clip_l, proj_l, with_projection=True),
            text_encoder_2=enc.clip_encoder(toks[1], clip_g, proj_g, with_projection=True),
            text_encoder_3=enc.t5_encoder(toks[2], model.transformer["joint_attention_dim"]))
    pipe.save_pretrained(str(folder))
    return folder


def parts(model: BenchModel) -> str:
    """What is built beside the transformer, for the bench's progress line."""
    if model.loader == "wan":
        return video.wan_parts(model.preset, model.size, model.resolution)
    encoders = "one-layer text encoders of the real widths" if model.size == "real" else "tiny text encoders"
    return f"{encoders} and {'the published VAE' if model.real_vae else 'a two-block VAE'}"


def parameters(model: BenchModel) -> int:
    """The transformer's parameter count, from a copy on the meta device (no memory)."""
    return sum(p.numel() for p in build_transformer(model, "meta").parameters())
