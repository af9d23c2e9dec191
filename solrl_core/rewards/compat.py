"""Import the `image-reward` package (1.5, the last release) under current transformers, without
editing site-packages. Each shim below is applied only where it is missing, so on older
transformers (4.x, where the package works as published) `import_image_reward` changes nothing.

1. `ImageReward/__init__.py` imports its CLIPScore and AestheticScore modules, which `import clip`
   (OpenAI's CLIP package). solrl never uses those two classes, so when `clip` is not installed a
   placeholder stands in for it during the import only (calling its `load` raises a clear error),
   and is removed from `sys.modules` afterwards so no other code mistakes it for the real package.
2. `models/BLIP/med.py` imports `apply_chunking_to_forward`, `find_pruneable_heads_and_indices` and
   `prune_linear_layer` from `transformers.modeling_utils`. transformers 5 moved the first and
   third to `transformers.pytorch_utils` and deleted the second; they are put back on
   `modeling_utils` before the import (the second as transformers 4 defined it).
3. med.py's `BertModel.__init__` calls `self.init_weights()`. In transformers 5, `init_weights`
   needs attributes that `post_init()` sets, and `post_init()` itself calls `init_weights()`.
   On transformers >= 5 `BertModel.init_weights` runs `post_init()` the first time (which calls
   back into it, now with the attributes set) and the library's `init_weights` after that.
4. med.py's `BertModel.forward` calls `invert_attention_mask` and `get_head_mask`, which
   transformers 5 removed from `PreTrainedModel`; transformers 4's definitions are added to
   `BertModel` where missing.
5. The package's import has two process-wide side effects that are undone: BLIP's `blip.py` runs
   `warnings.filterwarnings("ignore")` and `blip_pretrain.py` sets transformers' logging to ERROR.

`pkg_resources` (gone with setuptools >= 81) is not imported by anything on this path (ImageReward,
timm 0.6.13, fairscale, diffusers, accelerate, datasets, torchvision), so it needs no shim.
The package's `__init__` also imports its ReFL trainer, hence diffusers, accelerate and datasets:
they are declared dependencies of image-reward, so a missing one is an install problem and
surfaces, like a missing timm or fairscale, as the ImportError that the reward registry reports.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
import warnings

import torch


def find_pruneable_heads_and_indices(heads: list[int], n_heads: int, head_size: int,
                                     already_pruned_heads: set[int]) -> tuple[set[int], torch.Tensor]:
    """transformers 4's helper: the heads left to prune and the flat indices of the kept weights."""
    mask = torch.ones(n_heads, head_size)
    heads = set(heads) - already_pruned_heads
    for head in heads:
        head = head - sum(1 if h < head else 0 for h in already_pruned_heads)  # index after earlier prunes
        mask[head] = 0
    keep = mask.view(-1).contiguous().eq(1)
    return heads, torch.arange(len(keep))[keep].long()


def invert_attention_mask(self: torch.nn.Module, encoder_attention_mask: torch.Tensor) -> torch.Tensor:
    """transformers 4's `PreTrainedModel.invert_attention_mask`: 1/0 keep mask -> additive bias."""
    if encoder_attention_mask.dim() == 3:
        extended = encoder_attention_mask[:, None, :, :]
    elif encoder_attention_mask.dim() == 2:
        extended = encoder_attention_mask[:, None, None, :]
    else:
        raise ValueError(f"encoder_attention_mask must be 2-D or 3-D, got shape {tuple(encoder_attention_mask.shape)}")
    extended = extended.to(dtype=self.dtype)
    return (1.0 - extended) * torch.finfo(self.dtype).min


def get_head_mask(self: torch.nn.Module, head_mask: torch.Tensor | None, num_hidden_layers: int,
                  is_attention_chunked: bool = False) -> torch.Tensor | list[None]:
    """transformers 4's `PreTrainedModel.get_head_mask`: None per layer, or a 5-D broadcastable mask."""
    if head_mask is None:
        return [None] * num_hidden_layers
    if head_mask.dim() == 1:  # [heads]: the same for every layer
        head_mask = head_mask[None, None, :, None, None].expand(num_hidden_layers, -1, -1, -1, -1)
    elif head_mask.dim() == 2:  # [layers, heads]
        head_mask = head_mask[:, None, :, None, None]
    elif head_mask.dim() != 5:  # 5-D masks pass through as they are
        raise ValueError(f"head_mask must be 1-D, 2-D or 5-D, got shape {tuple(head_mask.shape)}")
    head_mask = head_mask.to(dtype=self.dtype)
    return head_mask.unsqueeze(-1) if is_attention_chunked else head_mask


def _init_weights_v5(self: torch.nn.Module) -> None:
    """BertModel.init_weights for transformers 5: `post_init` first (it sets the attributes that
    `init_weights` reads, then calls back into this method, which then initialises)."""
    from transformers.modeling_utils import PreTrainedModel

    if not hasattr(self, "all_tied_weights_keys"):
        self.post_init()
    else:
        PreTrainedModel.init_weights(self)


def _clip_placeholder() -> types.ModuleType:
    module = types.ModuleType("clip", "placeholder for OpenAI's CLIP package, set by solrl_core.rewards.compat")

    def load(*args: object, **kwargs: object) -> None:
        raise ImportError("OpenAI's CLIP package ('clip') is not installed: ImageReward's CLIPScore and "
                          "AestheticScore need it (pip install git+https://github.com/openai/CLIP.git); "
                          "solrl's ImageReward reward does not")

    module.load = load  # type: ignore[attr-defined]
    return module


def _restore_moved_helpers() -> None:
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils

    for name in ("apply_chunking_to_forward", "prune_linear_layer", "find_pruneable_heads_and_indices"):
        if not hasattr(modeling_utils, name):
            setattr(modeling_utils, name, getattr(pytorch_utils, name, None) or globals()[name])


def _import_package() -> None:
    """`import ImageReward` with `clip` stood in for if absent, undoing its global side effects."""
    import transformers

    placeholder = _clip_placeholder() if importlib.util.find_spec("clip") is None else None
    if placeholder is not None:
        sys.modules["clip"] = placeholder
    verbosity = transformers.logging.get_verbosity()
    try:
        with warnings.catch_warnings():  # restores the filters blip.py replaces with "ignore"
            importlib.import_module("ImageReward")
    finally:
        transformers.logging.set_verbosity(verbosity)
        if placeholder is not None and sys.modules.get("clip") is placeholder:
            del sys.modules["clip"]


@functools.cache
def import_image_reward() -> types.SimpleNamespace:
    """The image-reward classes solrl builds ImageReward from, importable and usable under the
    installed transformers: VisionTransformer (BLIP ViT), BertConfig, BertModel (BLIP's
    cross-attention BERT) and MLP (the reward head)."""
    import transformers

    _restore_moved_helpers()
    _import_package()
    med = importlib.import_module("ImageReward.models.BLIP.med")
    vit = importlib.import_module("ImageReward.models.BLIP.vit")
    head = importlib.import_module("ImageReward.ImageReward")
    if int(transformers.__version__.split(".")[0]) >= 5:
        med.BertModel.init_weights = _init_weights_v5
    for name, method in (("invert_attention_mask", invert_attention_mask), ("get_head_mask", get_head_mask)):
        if not hasattr(med.BertModel, name):
            setattr(med.BertModel, name, method)
    return types.SimpleNamespace(VisionTransformer=vit.VisionTransformer, BertConfig=med.BertConfig,
                                 BertModel=med.BertModel, MLP=head.MLP)
