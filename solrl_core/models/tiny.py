"""The tiny model: SANA's diffusers transformer at a small size, built offline, CPU-friendly.

Its text encoder is a small Gemma2 (SANA's text-encoder family) over a word-level tokenizer built
from a fixed vocabulary, so the full pipeline (tokenise, encode, seeded noise, ODE, decode, reward,
LoRA update) runs with nothing downloaded. The architecture is data (`TinyArch`): with no weights it
is `SANA.default` at random init; a weights folder (`config.json` + `model.safetensors`, as
`scripts/pretrain_tiny.py --world image` writes) brings its own architecture and vocabulary.

Latents are `image side / upscale` pixels square with 3 channels; the "VAE" decoder is a fixed
bilinear upsampler (identity at upscale 1). Like a real VAE it lets a random-init model's latent
contrast, not per-pixel noise, decide what an image looks like.

The loading both tiny models share is here once, with the model as a parameter (`TinyKind`): the
weights folder, the seeded init, the text side (`load_tiny`, `text_states`); the tiny video model
(models/tiny_video.py) is the other kind.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from diffusers import SanaTransformer2DModel
from safetensors.torch import load_file
from transformers import Gemma2Config, Gemma2Model, PreTrainedTokenizerFast

from solrl_core.config.schema import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel, sana_velocity
from solrl_core.data.words import ARCH_FILE, WEIGHTS_FILE, weights_folder

A = TypeVar("A")
DEFAULT_VOCAB = tuple((
    "a an the one two three four and of on in with left right above below top bottom small large big "
    "red green blue yellow purple orange white black gray pink brown circle circles square squares "
    "triangle triangles background photo"
).split())


@dataclass(frozen=True)
class Arch:
    """What every tiny model's architecture has: its transformer's attention heads and blocks, and its
    text side (a small Gemma2 of `text_layers` over a word-level `vocab`, `max_tokens` a caption)."""

    heads: int
    head_dim: int
    layers: int
    text_dim: int
    text_layers: int
    max_tokens: int
    vocab: tuple[str, ...]


@dataclass(frozen=True)
class TinyArch(Arch):
    patch_size: int
    upscale: int  # latent side = image side / upscale


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
        raise SolrlError(f"model.resolution={side} must be a multiple of {arch.upscale * arch.patch_size} for this "
                         f"tiny model",
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


@dataclass(frozen=True)
class TinyKind:
    """What sets one tiny model apart in loading: its default architecture, its modules, and how its
    transformer reads text. `load_tiny` and the pre-training read it."""

    default: Arch  # the architecture at random init, without a weights folder (a TinyArch, a VideoArch)
    # (arch, side, frames)
    modules: Callable[[Any, int, int], tuple[PreTrainedTokenizerFast, Gemma2Model, torch.nn.Module]]
    velocity: Callable[..., torch.Tensor]
    masked_text: bool  # True: states and the text mask (SANA); False: states zeroed at padding, no mask (Wan)
    script: str  # what writes its weights folders


@dataclass(frozen=True)
class TinyParts:
    arch: Any  # an Arch of the model's kind
    tokenizer: PreTrainedTokenizerFast
    text_encoder: Gemma2Model
    transformer: torch.nn.Module
    origin: str  # "weights NAME" or "random init (seed N)", for the model's description


def load_tiny(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, kind: TinyKind) -> TinyParts:
    """A tiny model's modules on `device`: `kind`'s default architecture at random init from
    model.init_seed, or what the weights folder model.weights holds."""
    folder = weights_folder(cfg.weights) if cfg.weights else None
    arch = read_arch(folder, type(kind.default), kind.script) if folder else kind.default
    torch.manual_seed(cfg.init_seed)  # the random init is part of the model's identity
    tokenizer, text_encoder, transformer = kind.modules(arch, cfg.resolution, cfg.frames)
    if folder:
        load_weights(folder, transformer, text_encoder, kind.script)
    transformer.to(device=device)
    if dtype != torch.float32:
        transformer.to(dtype=dtype)
    text_encoder.to(device=device)
    origin = f"weights {cfg.weights}" if folder else f"random init (seed {cfg.init_seed})"
    return TinyParts(arch, tokenizer, text_encoder, transformer, origin)


def text_states(parts: TinyParts, kind: TinyKind, prompts: list[str], device: torch.device) -> Conditioning:
    """The text encoder's states of `prompts` as `kind`'s transformer reads them (with gradients: the
    pre-training trains the encoder; a loaded model's `encode` runs it without)."""
    batch = parts.tokenizer(prompts, padding="max_length", truncation=True, max_length=parts.arch.max_tokens,
                            return_tensors="pt")
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    states = parts.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    if kind.masked_text:
        return Conditioning(states, mask)
    # as WanPipeline zero-pads its UMT5 states; Wan's transformer takes no text mask
    return Conditioning(states * mask[..., None], torch.ones_like(mask))


def encoder(parts: TinyParts, kind: TinyKind, device: torch.device) -> Callable[[list[str]], Conditioning]:
    """A loaded tiny model's `encode`."""
    @torch.no_grad()
    def encode(prompts: list[str]) -> Conditioning:
        return text_states(parts, kind, prompts, device)
    return encode


SANA = TinyKind(TinyArch(heads=2, head_dim=32, layers=4, text_dim=32, text_layers=1, max_tokens=16, vocab=DEFAULT_VOCAB,
                         patch_size=1, upscale=4),
                lambda arch, side, frames: build_modules(arch, side), sana_velocity, masked_text=True,
                script="scripts/pretrain_tiny.py --world image")


def build_tiny(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> DiffusionModel:
    parts = load_tiny(cfg, device, dtype, SANA)
    arch = parts.arch

    def decode(latents: torch.Tensor) -> torch.Tensor:
        up = latents.float()
        if arch.upscale > 1:
            up = torch.nn.functional.interpolate(up, scale_factor=arch.upscale, mode="bilinear", align_corners=False)
        return ((up + 1.0) / 2.0).clamp(0.0, 1.0)

    latent = cfg.resolution // arch.upscale
    return DiffusionModel(transformer=parts.transformer, encode=encoder(parts, SANA, device), decode=decode,
                          velocity=SANA.velocity, latent_shape=(3, latent, latent),
                          description=f"tiny SANA {arch.layers}x{arch.heads * arch.head_dim}, {latent}px latent, "
                                      f"{parts.origin}",
                          vocabulary=arch.vocab)


def read_arch(folder: Path, cls: type[A], script: str) -> A:
    """The architecture dataclass `cls` a weights folder's config.json describes (`script` writes such folders)."""
    try:
        data = json.loads((folder / ARCH_FILE).read_text())
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SolrlError(f"{folder / ARCH_FILE} is missing or does not describe a tiny model: {exc}",
                         f"regenerate the folder with {script}") from exc


def load_weights(folder: Path, transformer: torch.nn.Module, text_encoder: torch.nn.Module, script: str) -> None:
    try:
        state = load_file(str(folder / WEIGHTS_FILE))
    except Exception as exc:  # noqa: BLE001 - any read failure means the file cannot be used
        raise SolrlError(f"cannot read {folder / WEIGHTS_FILE}: {exc}", f"regenerate it with {script}") from exc
    for prefix, module in (("transformer.", transformer), ("text_encoder.", text_encoder)):
        part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(part, strict=False)
        if missing or unexpected:
            raise SolrlError(f"{folder / WEIGHTS_FILE} does not fit its config.json ({len(missing)} missing, "
                             f"{len(unexpected)} unexpected keys)",
                             f"regenerate it with {script}")
