"""Image rewards on video clips: each clip [F, 3, H, W] is scored on `count` of its frames, evenly
spaced from the first to the last (0: every frame), and the frames' scores combined into one per
clip (`reduce`: mean or min). The defaults are Flow-Factory's: its image rewards score a video on
every frame and take the mean (X-GenGroup/Flow-Factory a0b2bc5, src/flow_factory/rewards/
pick_score.py:86-119, `_compute_video_scores`: "mean PickScore across all frames for each video").

Which rewards judge what is declared once, in registry.py (`RewardInfo.media`, `RewardInfo.on_frames`);
the one-line refusal of a mismatch is names.check_media, run when a config is validated."""

from __future__ import annotations

from typing import Callable

import torch

from solrl_core.rewards.names import FRAME_REDUCTIONS


def frame_indices(frames: int, count: int) -> list[int]:
    """`count` frame indices evenly spaced over a clip of `frames` frames, first and last included
    (count 0, or count >= frames: every frame)."""
    if count <= 0 or count >= frames:
        return list(range(frames))
    if count == 1:
        return [frames // 2]
    return [round(i * (frames - 1) / (count - 1)) for i in range(count)]


def score_frames(score: Callable[[torch.Tensor, list[str]], torch.Tensor], clips: torch.Tensor, prompts: list[str],
                 count: int = 0, reduce: str = "mean") -> torch.Tensor:
    """One score per clip of `clips` [B, F, 3, H, W]: `score` (an image reward) on the sampled frames
    of every clip in one call, each frame with its clip's prompt, then combined per clip."""
    if reduce not in FRAME_REDUCTIONS:
        raise ValueError(f"unknown frame reduction {reduce!r}: one of {', '.join(FRAME_REDUCTIONS)}")
    b, f = clips.shape[:2]
    picked = clips[:, frame_indices(f, count)]
    k = picked.shape[1]
    flat = score(picked.reshape(b * k, *clips.shape[2:]), [p for p in prompts for _ in range(k)]).float().cpu()
    per_clip = flat.view(b, k)
    return per_clip.mean(dim=1) if reduce == "mean" else per_clip.min(dim=1).values
