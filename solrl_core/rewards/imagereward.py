"""ImageReward-v1.0 (Xu et al., 2023) as a solrl reward.

The model is BLIP's ViT image tower, BLIP's BERT text encoder that cross-attends to the image
tokens, and an MLP on the text encoder's [CLS] feature; its output is standardised with the mean
and std the authors measured. We build it from the image-reward package's own classes (imported
through `compat`) and score exactly as the package's `score_gard` does, but on tensors: images are
preprocessed on the device (`resize_crop_normalize`, matching its bicubic Resize + CenterCrop +
CLIP normalisation) and scored in batches, where the package takes one PIL image at a time.

The package hard-codes a ViT-L/16 at 224 px; we read the tower's size off the checkpoint instead
(`vision_size`), so the real checkpoint builds exactly that tower and a tiny test checkpoint builds
a tiny one through the same code.
"""

from __future__ import annotations

import math
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from solrl_core.errors import SolrlError
from solrl_core.rewards.base import RewardContext
from solrl_core.rewards.preprocess import resize_crop_normalize, score_in_batches
from solrl_core.rewards.weights import hub_file, local_fix, local_folder

NAME = "imagereward"
HUB_ID = "THUDM/ImageReward"
CHECKPOINT = "ImageReward.pt"
MED_CONFIG = "med_config.json"
TOKENIZER_ID = "bert-base-uncased"
TOKENIZER_DIR = "tokenizer"  # optional subfolder of reward.paths.imagereward, from save_pretrained
MAX_TOKENS = 35  # the package truncates and pads every prompt to 35 tokens
MEAN = 0.16717362830052426  # ImageReward.mean/std: the raw head output's statistics
STD = 1.0333394966054072
HEAD_DIM = 64  # per-head width of BLIP's ViT-B (768 / 12) and ViT-L (1024 / 16), as in every standard ViT
VISION = "blip.visual_encoder."
_BLOCK = re.compile(re.escape(VISION) + r"blocks\.(\d+)\.")


@dataclass(frozen=True)
class VisionSize:
    """The shape of BLIP's ViT, as `VisionTransformer` takes it."""

    image_size: int
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float


def vision_size(state: Mapping[str, Any], source: str = CHECKPOINT) -> VisionSize:
    """The ViT's size read off a checkpoint; only shapes are used, so meta tensors work.

    embed dim and patch size: the patch projection's conv weight [embed, 3, patch, patch]; image
    size: patch * sqrt(positions - 1) (one position is the class token); depth: the number of
    `blocks.N`; MLP ratio: fc1's width / embed. The head count is not stored in any weight (qkv is
    [3 * embed, embed] whatever it is), so it is embed / 64: 16 heads for ViT-L, 12 for ViT-B."""
    try:
        embed, _, patch, _ = state[VISION + "patch_embed.proj.weight"].shape
        positions = state[VISION + "pos_embed"].shape[1]
        hidden = state[VISION + "blocks.0.mlp.fc1.weight"].shape[0]
    except KeyError as exc:
        raise SolrlError(f"{source} is not an ImageReward checkpoint: it lacks {exc.args[0]}",
                         f"use ImageReward.pt from hub {HUB_ID}") from exc
    grid = math.isqrt(positions - 1)
    if grid * grid != positions - 1 or embed % HEAD_DIM:
        raise SolrlError(f"{source}: a {embed}-wide vision tower with {positions} positions is not a square-image ViT "
                         f"with {HEAD_DIM}-wide heads", f"use ImageReward.pt from hub {HUB_ID}")
    depth = 1 + max(int(m.group(1)) for k in state if (m := _BLOCK.match(k)))
    return VisionSize(image_size=grid * patch, patch_size=patch, embed_dim=embed, depth=depth,
                      num_heads=embed // HEAD_DIM, mlp_ratio=hidden / embed)


class ImageRewardNet(nn.Module):
    """ImageReward's modules under the checkpoint's names (blip.visual_encoder, blip.text_encoder,
    mlp); `forward` is the package's `score_gard`."""

    def __init__(self, visual_encoder: nn.Module, text_encoder: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.blip = nn.Module()
        self.blip.visual_encoder = visual_encoder
        self.blip.text_encoder = text_encoder
        self.mlp = mlp

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Normalised reward [B] for preprocessed images [B, 3, S, S] and tokenised prompts."""
        image_embeds = self.blip.visual_encoder(pixels)
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        text = self.blip.text_encoder(input_ids, attention_mask=attention_mask, encoder_hidden_states=image_embeds,
                                      encoder_attention_mask=image_atts, return_dict=True)
        rewards = self.mlp(text.last_hidden_state[:, 0, :])
        return ((rewards - MEAN) / STD).squeeze(-1)


def build_net(state: Mapping[str, torch.Tensor], size: VisionSize, med_config: Path,
              source: str = CHECKPOINT) -> ImageRewardNet:
    """An ImageRewardNet with a `size` vision tower and a `med_config` text encoder, with `state`'s
    weights loaded. Keys of modules solrl does not use (vision_proj, text_proj, ...) are ignored."""
    from solrl_core.rewards.compat import import_image_reward

    ir = import_image_reward()
    visual = ir.VisionTransformer(img_size=size.image_size, patch_size=size.patch_size, embed_dim=size.embed_dim,
                                  depth=size.depth, num_heads=size.num_heads, mlp_ratio=size.mlp_ratio)
    config = ir.BertConfig.from_json_file(str(med_config))
    config.encoder_width = size.embed_dim
    text = ir.BertModel(config=config, add_pooling_layer=False)
    net = ImageRewardNet(visual, text, ir.MLP(config.hidden_size))
    expected = net.state_dict()
    # position_ids is a constant arange buffer; BLIP too lets it be missing.
    missing = [k for k in expected if k not in state and not k.endswith("embeddings.position_ids")]
    if missing:
        raise SolrlError(f"{source} lacks {len(missing)} weights of the ImageReward model, e.g. "
                         f"{', '.join(missing[:3])}",
                         f"use ImageReward.pt and med_config.json from hub {HUB_ID} together")
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if wrong:
        k = wrong[0]
        raise SolrlError(f"{source}: {k} has shape {tuple(state[k].shape)}, but {med_config.name} builds "
                         f"{tuple(expected[k].shape)} ({len(wrong)} such weights)",
                         f"use ImageReward.pt and med_config.json from hub {HUB_ID} together")
    net.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return net


def load_tokenizer(folder: Path | None) -> Any:
    """BLIP's tokenizer: BERT's, from `folder/tokenizer` if there, else the hub; plus the two
    special tokens BLIP's `init_tokenizer` adds."""
    from transformers import BertTokenizer

    local = folder / TOKENIZER_DIR if folder is not None else None
    if local is not None and local.is_dir():
        tokenizer = BertTokenizer.from_pretrained(str(local))
    else:
        try:
            tokenizer = BertTokenizer.from_pretrained(TOKENIZER_ID)
        except Exception as exc:  # noqa: BLE001 - every hub failure becomes the same actionable error
            raise SolrlError(f"reward '{NAME}' needs the tokenizer of hub {TOKENIZER_ID}, which is neither in the "
                             f"Hugging Face cache nor reachable ({type(exc).__name__})",
                             f"download it once where there is network, or save it with "
                             f"BertTokenizer.save_pretrained into a {TOKENIZER_DIR}/ subfolder of the folder "
                             f"given with --set reward.paths.{NAME}=DIR") from exc
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


class ImageRewardScore:
    """ImageReward-v1.0: higher means people would prefer the image for the prompt; standardised
    with the authors' mean and std, so scores are roughly zero-centred with unit spread."""

    name = NAME

    def __init__(self, net: ImageRewardNet, tokenizer: Any, image_size: int, ctx: RewardContext) -> None:
        self.net = net.eval().to(device=ctx.device, dtype=ctx.dtype)
        self.tokenizer = tokenizer
        self.image_size = image_size
        self.device, self.dtype, self.batch_size = ctx.device, ctx.dtype, ctx.batch_size

    @classmethod
    def load(cls, ctx: RewardContext) -> ImageRewardScore:
        """From `ctx.path` (a folder laid out like the hub repo, optionally with tokenizer/) or the hub."""
        if ctx.path:
            folder: Path | None = local_folder(NAME, ctx.path, [CHECKPOINT, MED_CONFIG])
            checkpoint, med_config = folder / CHECKPOINT, folder / MED_CONFIG
        else:
            folder = None
            checkpoint, med_config = hub_file(NAME, HUB_ID, CHECKPOINT), hub_file(NAME, HUB_ID, MED_CONFIG)
        try:  # the checkpoint is a plain state dict of tensors, which weights_only loading accepts
            state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        except (RuntimeError, EOFError, pickle.UnpicklingError) as exc:  # truncated or not a state dict
            raise SolrlError(f"{checkpoint} cannot be read as a state dict ({type(exc).__name__}: {exc})",
                             local_fix(NAME, [CHECKPOINT, MED_CONFIG])) from exc
        size = vision_size(state, str(checkpoint))
        net = build_net(state, size, med_config, str(checkpoint))
        return cls(net, load_tokenizer(folder), size.image_size, ctx)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return score_in_batches(images, prompts, self.batch_size, self._score)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        pixels = resize_crop_normalize(images.to(self.device), self.image_size).to(self.dtype)
        tokens = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=MAX_TOKENS,
                                return_tensors="pt").to(self.device)
        return self.net(pixels, tokens.input_ids, tokens.attention_mask)
