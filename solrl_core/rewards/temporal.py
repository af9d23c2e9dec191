"""Temporal consistency of a video clip: the mean cosine similarity of consecutive frames' CLIP
ViT-L/14 image features, in [-1, 1] (1: every frame looks alike to CLIP). A video reward (registry.py
declares it so): it judges clips [B, F, 3, H, W] and refuses an image model's run. Weighed against an
image reward scored on frames, it keeps a clip from trading coherence for per-frame quality; alone it
is maximised by a still clip, so it is meant as a second reward, not the only one.

Its model is the clipscore reward's (openai/clip-vit-large-patch14, or the CLIP folder named by
reward.paths.temporal_consistency), loaded the same way; the prompt is not used."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from solrl_core.rewards.clip_rewards import ClipScore, _embedding
from solrl_core.rewards.preprocess import resize_crop_normalize


class TemporalConsistency(ClipScore):
    name = "temporal_consistency"

    @torch.no_grad()
    def __call__(self, clips: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        if clips.dim() != 5:
            raise ValueError(f"temporal_consistency judges clips [B, F, 3, H, W], not a tensor of shape "
                             f"{tuple(clips.shape)}")
        b, f = clips.shape[:2]
        frames = clips.reshape(b * f, *clips.shape[2:])
        features = torch.cat([self._features(frames[i:i + self.batch_size]) for i in range(0, b * f, self.batch_size)])
        features = features.view(b, f, -1)
        if f < 2:
            return torch.ones(b)
        return (features[:, 1:] * features[:, :-1]).sum(-1).mean(dim=1).cpu()

    def _features(self, images: torch.Tensor) -> torch.Tensor:
        pixels = resize_crop_normalize(images.to(self.device), self.size, self.crop, self.mean, self.std).to(self.dtype)
        return F.normalize(_embedding(self.model.get_image_features(pixel_values=pixels)).float(), dim=-1)
