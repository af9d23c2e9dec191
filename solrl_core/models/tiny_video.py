"""The tiny video model: diffusers' WanTransformer3DModel (Wan's own video transformer) at a small
size, over the pixels of short clips, built offline and CPU-friendly: the tiny moving world's model
(`solrl_core.data.tinyvideo`).

Why Wan and not the tiny SANA over frame tokens: at the tiny moving world's size (4 frames of 16x16,
patch 1x4x4: 64 tokens a clip) the two cost about the same on a CPU, and Wan attends across frames
and exercises the video code paths (5-D latents, the Wan velocity call) that the real Wan presets use.

Text side as the tiny model's (models/tiny.py): a word-level tokenizer and a small Gemma2 encoder;
its hidden states are zeroed at the padding, as WanPipeline zero-pads its UMT5 states, and, as in
Wan, the transformer takes no text mask. The "VAE" is the identity: latents [3, F, H, W] are the
pixels in [-1, 1], and `decode` returns clips [B, F, 3, H, W] in [0, 1]. A weights folder
(config.json + model.safetensors, as scripts/pretrain_tinyvideo.py writes) brings its own
architecture; without one, `VideoArch()` at random init from model.init_seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solrl_core.config.schema import ModelConfig
from solrl_core.data.tinyvideo import VOCAB
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.models.tiny import build_text_side, load_weights, read_arch, weights_folder
from solrl_core.models.wan import wan_velocity

SCRIPT = "scripts/pretrain_tinyvideo.py"


@dataclass(frozen=True)
class VideoArch:
    heads: int = 4
    head_dim: int = 32
    layers: int = 4
    ffn_dim: int = 256
    freq_dim: int = 64  # sinusoidal timestep features
    patch: tuple[int, int, int] = (1, 4, 4)  # frames, height, width
    text_dim: int = 64
    text_layers: int = 2
    max_tokens: int = 8
    vocab: tuple[str, ...] = VOCAB


def build_video_modules(arch: VideoArch, side: int, frames: int):  # noqa: ANN201 - (tokenizer, Gemma2Model, WanTransformer3DModel)
    """Tokenizer, text encoder and transformer of `arch` at random init (seed torch first)."""
    from diffusers import WanTransformer3DModel

    if side % arch.patch[1] or frames % arch.patch[0]:
        raise SolrlError(f"model.resolution={side} and model.frames={frames} must be multiples of the tiny video model's "
                         f"patch {arch.patch[1]} and {arch.patch[0]}", "use the tiny_video preset's resolution and frames")
    tokenizer, text_encoder = build_text_side(arch.vocab, arch.text_dim, arch.text_layers)
    transformer = WanTransformer3DModel(
        patch_size=arch.patch, num_attention_heads=arch.heads, attention_head_dim=arch.head_dim, in_channels=3,
        out_channels=3, text_dim=arch.text_dim, freq_dim=arch.freq_dim, ffn_dim=arch.ffn_dim, num_layers=arch.layers,
        rope_max_seq_len=64,
    )
    return tokenizer, text_encoder, transformer


def build_tiny_video(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> DiffusionModel:
    folder = weights_folder(cfg.weights) if cfg.weights else None
    arch = read_arch(folder, VideoArch, SCRIPT) if folder else VideoArch()
    torch.manual_seed(cfg.init_seed)  # the random init is part of the model's identity
    tokenizer, text_encoder, transformer = build_video_modules(arch, cfg.resolution, cfg.frames)
    if folder:
        load_weights(folder, transformer, text_encoder, SCRIPT)
    transformer.to(device=device)
    if dtype != torch.float32:
        transformer.to(dtype=dtype)
    text_encoder.to(device=device)

    @torch.no_grad()
    def encode(prompts: list[str]) -> Conditioning:
        batch = tokenizer(prompts, padding="max_length", truncation=True, max_length=arch.max_tokens, return_tensors="pt")
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        states = text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float() * mask[..., None]
        return Conditioning(states, torch.ones_like(mask))

    def decode(latents: torch.Tensor) -> torch.Tensor:
        return ((latents.float().permute(0, 2, 1, 3, 4) + 1.0) / 2.0).clamp(0.0, 1.0)  # [B, 3, F, H, W] -> [B, F, 3, H, W]

    origin = f"weights {cfg.weights}" if folder else f"random init (seed {cfg.init_seed})"
    width = arch.heads * arch.head_dim
    return DiffusionModel(transformer=transformer, encode=encode, decode=decode, velocity=wan_velocity,
                          latent_shape=(3, cfg.frames, cfg.resolution, cfg.resolution),  # type: ignore[arg-type]
                          description=f"tiny Wan {arch.layers}x{width}, {cfg.frames} frames of {cfg.resolution}px, {origin}",
                          vocabulary=arch.vocab, frames=cfg.frames)
