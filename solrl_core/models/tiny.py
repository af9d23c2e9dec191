"""The tiny model: SANA's diffusers transformer at a small size, built offline, CPU-friendly.

Its text encoder is a small Gemma2 (SANA's text-encoder family) over a word-level tokenizer built
from a fixed vocabulary, so the full pipeline (tokenise, encode, seeded noise, ODE, decode, reward,
LoRA update) runs with nothing downloaded. The architecture is data (`TinyArch`): with no weights it
is the default below at random init; a weights folder (`config.json` + `model.safetensors`, as the
tiny-world pre-training script writes) brings its own architecture and vocabulary.

Latents are `image side / upscale` pixels square with 3 channels; the "VAE" decoder is a fixed
bilinear upsampler (identity at upscale 1). Like a real VAE it lets a random-init model's latent
contrast, not per-pixel noise, decide what an image looks like.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TypeVar

import torch
from diffusers import SanaTransformer2DModel
from safetensors.torch import load_file
from transformers import Gemma2Config, Gemma2Model, PreTrainedTokenizerFast

from solrl_core.config.schema import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel, sana_velocity

WEIGHTS_FILE, ARCH_FILE = "model.safetensors", "config.json"
A = TypeVar("A")
DEFAULT_VOCAB = tuple((
    "a an the one two three four and of on in with left right above below top bottom small large big "
    "red green blue yellow purple orange white black gray pink brown circle circles square squares "
    "triangle triangles background photo"
).split())


@dataclass(frozen=True)
class TinyArch:
    heads: int = 2
    head_dim: int = 32
    layers: int = 4
    patch_size: int = 1
    upscale: int = 4  # latent side = image side / upscale
    text_dim: int = 32
    text_layers: int = 1
    max_tokens: int = 16
    vocab: tuple[str, ...] = DEFAULT_VOCAB


def build_tokenizer(vocab: tuple[str, ...]) -> PreTrainedTokenizerFast:
    """A lowercase word-level tokenizer over `vocab`; unknown words map to [UNK]."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    ids = {tok: i for i, tok in enumerate(["[PAD]", "[UNK]", *vocab])}
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def build_text_side(vocab: tuple[str, ...], dim: int, layers: int) -> tuple[PreTrainedTokenizerFast, Gemma2Model]:
    """The word-level tokenizer over `vocab` and a small Gemma2 text encoder at random init."""
    tokenizer = build_tokenizer(vocab)
    text_encoder = Gemma2Model(Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=dim, intermediate_size=2 * dim, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=0,
    )).eval()
    return tokenizer, text_encoder


def build_modules(arch: TinyArch, side: int) -> tuple[PreTrainedTokenizerFast, Gemma2Model, SanaTransformer2DModel]:
    """Tokenizer, text encoder and transformer of `arch` at random init (seed torch first)."""
    if side % (arch.upscale * arch.patch_size):
        raise SolrlError(f"model.resolution={side} must be a multiple of {arch.upscale * arch.patch_size} for this tiny model",
                         "use 32")
    tokenizer, text_encoder = build_text_side(arch.vocab, arch.text_dim, arch.text_layers)
    width = arch.heads * arch.head_dim
    transformer = SanaTransformer2DModel(
        in_channels=3, out_channels=3, num_attention_heads=arch.heads, attention_head_dim=arch.head_dim,
        num_layers=arch.layers, num_cross_attention_heads=arch.heads, cross_attention_head_dim=arch.head_dim,
        cross_attention_dim=width, caption_channels=arch.text_dim, sample_size=side // arch.upscale,
        patch_size=arch.patch_size,
    )
    return tokenizer, text_encoder, transformer


def save_tiny(folder: str | Path, arch: object, transformer: torch.nn.Module, text_encoder: torch.nn.Module) -> None:
    """Write a weights folder `build_tiny` can load (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {f"transformer.{k}": v.detach().contiguous().cpu() for k, v in transformer.state_dict().items()}
    state.update({f"text_encoder.{k}": v.detach().contiguous().cpu() for k, v in text_encoder.state_dict().items()})
    save_file(state, str(folder / WEIGHTS_FILE))
    (folder / ARCH_FILE).write_text(json.dumps(dataclasses.asdict(arch), indent=2))


def build_tiny(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> DiffusionModel:
    folder = weights_folder(cfg.weights) if cfg.weights else None
    arch = read_arch(folder, TinyArch) if folder else TinyArch()
    side = cfg.resolution
    torch.manual_seed(cfg.init_seed)  # the random init is part of the model's identity
    tokenizer, text_encoder, transformer = build_modules(arch, side)
    if folder:
        load_weights(folder, transformer, text_encoder)
    transformer.to(device=device)
    if dtype != torch.float32:
        transformer.to(dtype=dtype)
    text_encoder.to(device=device)

    @torch.no_grad()
    def encode(prompts: list[str]) -> Conditioning:
        batch = tokenizer(prompts, padding="max_length", truncation=True, max_length=arch.max_tokens, return_tensors="pt")
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        return Conditioning(text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float(), mask)

    def decode(latents: torch.Tensor) -> torch.Tensor:
        up = latents.float()
        if arch.upscale > 1:
            up = torch.nn.functional.interpolate(up, scale_factor=arch.upscale, mode="bilinear", align_corners=False)
        return ((up + 1.0) / 2.0).clamp(0.0, 1.0)

    latent = side // arch.upscale
    origin = f"weights {cfg.weights}" if folder else f"random init (seed {cfg.init_seed})"
    return DiffusionModel(transformer=transformer, encode=encode, decode=decode, velocity=sana_velocity,
                          latent_shape=(3, latent, latent),
                          description=f"tiny SANA {arch.layers}x{arch.heads * arch.head_dim}, {latent}px latent, {origin}",
                          vocabulary=arch.vocab)


def weights_folder(spec: str) -> Path:
    """A weights folder by path, or by name among those shipped in solrl_core/models/."""
    path = Path(spec)
    if path.is_dir():
        return path
    shipped = Path(str(resources.files("solrl_core.models"))) / spec
    if shipped.is_dir():
        return shipped
    raise SolrlError(f"tiny model weights '{spec}' not found (neither a folder nor a shipped weights name)",
                     "give a folder holding config.json and model.safetensors in model.weights, or leave it empty")


def read_arch(folder: Path, cls: type[A], script: str = "scripts/pretrain_tinyworld.py") -> A:
    """The architecture dataclass `cls` a weights folder's config.json describes (`script` writes such folders)."""
    try:
        data = json.loads((folder / ARCH_FILE).read_text())
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SolrlError(f"{folder / ARCH_FILE} is missing or does not describe a tiny model: {exc}",
                         f"regenerate the folder with {script}") from exc


def load_weights(folder: Path, transformer: torch.nn.Module, text_encoder: torch.nn.Module,
                 script: str = "scripts/pretrain_tinyworld.py") -> None:
    try:
        state = load_file(str(folder / WEIGHTS_FILE))
    except Exception as exc:  # noqa: BLE001 - any read failure means the file cannot be used
        raise SolrlError(f"cannot read {folder / WEIGHTS_FILE}: {exc}", f"regenerate it with {script}") from exc
    for prefix, module in (("transformer.", transformer), ("text_encoder.", text_encoder)):
        part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(part, strict=False)
        if missing or unexpected:
            raise SolrlError(f"{folder / WEIGHTS_FILE} does not fit its config.json ({len(missing)} missing, {len(unexpected)} unexpected keys)",
                             f"regenerate it with {script}")
