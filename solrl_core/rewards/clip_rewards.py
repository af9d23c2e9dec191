"""CLIP-similarity rewards through transformers' CLIPModel: PickScore_v1 and CLIP ViT-L/14 score.

Both score image i against prompt i as `logit_scale.exp() * cos(text_emb, image_emb) / divisor`:
26 for PickScore (as Flow-GRPO's scorer does), 100 for CLIPScore (the cosine itself, CLIP ViT-L/14's
logit_scale being 100). Images are preprocessed on tensors with `resize_crop_normalize`, using the
sizes, mean and std of the model's own image processor.

Weights: `ctx.path` is one folder holding the model and the processor (what `model.save_pretrained`
and `processor.save_pretrained` write), loaded without touching the network; otherwise the hub ids
(or the Hugging Face cache when offline).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from transformers import CLIPModel, CLIPProcessor

from solrl_core.errors import SolrlError
from solrl_core.rewards.base import RewardContext
from solrl_core.rewards.preprocess import resize_crop_normalize, score_in_batches
from solrl_core.rewards.weights import local_fix, local_folder

MAX_TOKENS = 77  # CLIP's text context; longer prompts are truncated as the official scorers do


def _embedding(out: Any) -> torch.Tensor:
    """transformers 4 returns the projected embeddings; 5 returns a model output holding them as pooler_output."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def processor_geometry(image_processor: Any) -> tuple[int, int, list[float], list[float]]:
    """(shortest edge, square crop, mean, std) of a CLIP image processor: what `resize_crop_normalize` needs."""
    edge = image_processor.size.get("shortest_edge")  # a dict in transformers 4, a SizeDict in 5: both have .get
    crop = image_processor.crop_size
    if edge is None or crop["height"] != crop["width"]:
        raise SolrlError(f"image processor resizes to {dict(image_processor.size)} and crops to {dict(crop)}; "
                         "only a shortest-edge resize with a square centre crop is supported",
                         "use the CLIP image processor saved with the model")
    return int(edge), int(crop["height"]), list(image_processor.image_mean), list(image_processor.image_std)


class ClipSimilarity:
    """A CLIPModel reward: logit_scale.exp() * cos(text, image) / `divisor`, image i against prompt i."""

    name: str
    model_id: ClassVar[str]
    processor_id: ClassVar[str]
    divisor: ClassVar[float]

    def __init__(self, model: Any, processor: Any, ctx: RewardContext) -> None:
        self.model = model.to(device=ctx.device, dtype=ctx.dtype).eval()
        self.tokenizer = processor.tokenizer
        self.size, self.crop, self.mean, self.std = processor_geometry(processor.image_processor)
        self.device, self.dtype, self.batch_size = ctx.device, ctx.dtype, ctx.batch_size

    @classmethod
    def load(cls, ctx: RewardContext) -> ClipSimilarity:
        if ctx.path:
            folder = local_folder(cls.name, ctx.path, ["config.json"])
            try:  # local_files_only: a complete folder never reaches for the network
                model = CLIPModel.from_pretrained(folder, local_files_only=True)
                processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise SolrlError(f"reward '{cls.name}' cannot load a CLIP model and processor from {folder} ({exc})",
                                 "save both there with model.save_pretrained(DIR) and "
                                 "processor.save_pretrained(DIR)") from exc
            return cls(model, processor, ctx)
        hub = cls.model_id if cls.model_id == cls.processor_id else f"{cls.model_id} + processor {cls.processor_id}"
        try:
            model = CLIPModel.from_pretrained(cls.model_id)
            processor = CLIPProcessor.from_pretrained(cls.processor_id)
        except (OSError, ValueError) as exc:
            raise SolrlError(f"reward '{cls.name}' needs hub {hub}, which is neither in the Hugging Face cache nor "
                             f"reachable ({type(exc).__name__})",
                             local_fix(cls.name, ["the model and processor (save_pretrained of both)"])) from exc
        return cls(model, processor, ctx)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return score_in_batches(images, prompts, self.batch_size, self._score)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        pixels = resize_crop_normalize(images.to(self.device), self.size, self.crop, self.mean, self.std).to(self.dtype)
        tokens = self.tokenizer(prompts, padding="max_length", max_length=MAX_TOKENS, truncation=True,
                                return_tensors="pt").to(self.device)
        image_emb = F.normalize(_embedding(self.model.get_image_features(pixel_values=pixels)).float(), dim=-1)
        text_emb = F.normalize(_embedding(self.model.get_text_features(
            input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])).float(), dim=-1)
        cos = (image_emb * text_emb).sum(-1)  # the diagonal of image_emb @ text_emb.T
        return self.model.logit_scale.float().exp() * cos / self.divisor


class PickScore(ClipSimilarity):
    """PickScore_v1 (CLIP ViT-H/14 fine-tuned on Pick-a-Pic preferences), the laion ViT-H/14 processor."""

    name = "pickscore"
    model_id = "yuvalkirstain/PickScore_v1"
    processor_id = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
    divisor = 26.0


class ClipScore(ClipSimilarity):
    """OpenAI CLIP ViT-L/14 image-text similarity."""

    name = "clipscore"
    model_id = "openai/clip-vit-large-patch14"
    processor_id = "openai/clip-vit-large-patch14"
    divisor = 100.0
