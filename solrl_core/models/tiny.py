"""The tiny model: SANA's diffusers transformer at a small size, in pixel space, built offline.

Its text encoder is a one-layer Gemma2 (SANA's text-encoder family) over a word-level tokenizer
built from a fixed vocabulary, so the full pipeline (tokenise, encode, seeded noise, ODE, decode,
reward, LoRA update) runs on a CPU with nothing downloaded. Latents are 3x8x8 and the "VAE" decoder
is a fixed bilinear x4 upsampler to 32x32 RGB: like a real VAE it makes the latent's contrast and
structure, not per-pixel noise, decide what an image looks like, so even random weights give
pixel-statistics rewards something to climb. Trained weights, when a preset names a `weights`
file, replace the random init; the architecture stays the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import SanaTransformer2DModel
from safetensors.torch import load_file
from transformers import Gemma2Config, Gemma2Model, PreTrainedTokenizerFast

from solrl_core.config import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel, sana_velocity

VOCAB = (
    "a an the one two three four and of on in with left right above below top bottom small large big "
    "red green blue yellow purple orange white black gray pink brown circle circles square squares "
    "triangle triangles background photo"
).split()
MAX_TOKENS = 16


@dataclass(frozen=True)
class TinyArch:
    hidden_heads: int = 2
    head_dim: int = 32
    layers: int = 4
    patch_size: int = 1
    upscale: int = 4  # latent side = image side / upscale; the decoder is a fixed bilinear upsampler
    text_dim: int = 32


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A lowercase word-level tokenizer over VOCAB; unknown words map to [UNK]."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(["[PAD]", "[UNK]", *VOCAB])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def build_tiny(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> DiffusionModel:
    arch = TinyArch()
    side = cfg.resolution
    if side % arch.upscale:
        raise SolrlError(f"model.resolution={side} must be a multiple of {arch.upscale} for the tiny model", "use 32")
    latent = side // arch.upscale
    torch.manual_seed(cfg.init_seed)  # the random init is part of the model's identity
    tokenizer = build_tokenizer()
    text_encoder = Gemma2Model(Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=arch.text_dim, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=0,
    )).eval()
    heads = arch.hidden_heads
    transformer = SanaTransformer2DModel(
        in_channels=3, out_channels=3, num_attention_heads=heads, attention_head_dim=arch.head_dim,
        num_layers=arch.layers, num_cross_attention_heads=heads, cross_attention_head_dim=arch.head_dim,
        cross_attention_dim=heads * arch.head_dim, caption_channels=arch.text_dim, sample_size=latent,
        patch_size=arch.patch_size,
    )
    if cfg.weights:
        _load_weights(cfg.weights, transformer, text_encoder)
    transformer.to(device=device)
    if dtype != torch.float32:
        transformer.to(dtype=dtype)
    text_encoder.to(device=device)

    @torch.no_grad()
    def encode(prompts: list[str]) -> Conditioning:
        batch = tokenizer(prompts, padding="max_length", truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        return Conditioning(text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float(), mask)

    def decode(latents: torch.Tensor) -> torch.Tensor:
        up = torch.nn.functional.interpolate(latents.float(), scale_factor=arch.upscale, mode="bilinear", align_corners=False)
        return ((up + 1.0) / 2.0).clamp(0.0, 1.0)

    return DiffusionModel(transformer=transformer, encode=encode, decode=decode, velocity=sana_velocity,
                          latent_shape=(3, latent, latent),
                          description=f"tiny SANA {arch.layers}x{heads * arch.head_dim} patch {arch.patch_size}, {side}px pixel space")


def _load_weights(spec: str, transformer: torch.nn.Module, text_encoder: torch.nn.Module) -> None:
    from importlib import resources

    path = Path(spec)
    if not path.is_file():
        shipped = resources.files("solrl_core.models") / spec
        if not shipped.is_file():
            raise SolrlError(f"tiny model weights '{spec}' not found", "give a .safetensors path in model.weights or leave it empty")
        path = Path(str(shipped))
    state = load_file(str(path))
    for prefix, module in (("transformer.", transformer), ("text_encoder.", text_encoder)):
        part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(part, strict=False)
        if missing or unexpected:
            raise SolrlError(f"tiny model weights {path} do not fit the architecture ({len(missing)} missing, {len(unexpected)} unexpected keys)",
                             "regenerate them with the training script of the same solrl version")
