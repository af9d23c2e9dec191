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
(config.json + model.safetensors, as `scripts/pretrain_tiny.py --world video` writes) brings its own
architecture; without one, `VIDEO.default` at random init from model.init_seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solrl_core.config.schema import ModelConfig
from solrl_core.data.tinyvideo import VOCAB
from solrl_core.errors import SolrlError
from solrl_core.models.base import DiffusionModel
from solrl_core.models.tiny import Arch, TinyKind, build_text_side, encoder, load_tiny
from solrl_core.models.wan import wan_velocity


@dataclass(frozen=True)
class VideoArch(Arch):
    ffn_dim: int
    freq_dim: int  # sinusoidal timestep features
    patch: tuple[int, int, int]  # frames, height, width


# (tokenizer, Gemma2Model, WanTransformer3DModel)
def build_video_modules(arch: VideoArch, side: int, frames: int):  # noqa: ANN201
    """Tokenizer, text encoder and transformer of `arch` at random init (seed torch first)."""
    from diffusers import WanTransformer3DModel

    if side % arch.patch[1] or frames % arch.patch[0]:
        raise SolrlError(f"model.resolution={side} and model.frames={frames} must be multiples of the tiny video "
                         f"model's patch {arch.patch[1]} and "
                         f"{arch.patch[0]}", "use the tiny_video preset's resolution and frames")
    tokenizer, text_encoder = build_text_side(arch.vocab, arch.text_dim, arch.text_layers)
    transformer = WanTransformer3DModel(
        patch_size=arch.patch, num_attention_heads=arch.heads, attention_head_dim=arch.head_dim, in_channels=3,
        out_channels=3, text_dim=arch.text_dim, freq_dim=arch.freq_dim, ffn_dim=arch.ffn_dim, num_layers=arch.layers,
        rope_max_seq_len=64,
    )
    return tokenizer, text_encoder, transformer


VIDEO = TinyKind(VideoArch(heads=4, head_dim=32, layers=4, text_dim=64, text_layers=2, max_tokens=8, vocab=VOCAB,
                           ffn_dim=256, freq_dim=64, patch=(1, 4, 4)),
                 build_video_modules, wan_velocity, masked_text=False, script="scripts/pretrain_tiny.py --world video")


def build_tiny_video(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> DiffusionModel:
    parts = load_tiny(cfg, device, dtype, VIDEO)
    arch = parts.arch

    def decode(latents: torch.Tensor) -> torch.Tensor:
        # [B, 3, F, H, W] -> [B, F, 3, H, W]
        return ((latents.float().permute(0, 2, 1, 3, 4) + 1.0) / 2.0).clamp(0.0, 1.0)

    return DiffusionModel(transformer=parts.transformer, encode=encoder(parts, VIDEO, device), decode=decode,
                          velocity=VIDEO.velocity,  # type: ignore[arg-type]
                          latent_shape=(3, cfg.frames, cfg.resolution, cfg.resolution),
                          description=f"tiny Wan {arch.layers}x{arch.heads * arch.head_dim}, {cfg.frames} frames of "
                                      f"{cfg.resolution}px, {parts.origin}",
                          vocabulary=arch.vocab, frames=cfg.frames)
