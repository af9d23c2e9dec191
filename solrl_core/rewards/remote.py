"""`remote:URL`: the rewards a `solrl reward-server` serves (rewards/server.py), as one reward.

Built once at the start of a run: GET URL/health must answer (so an unreachable server, a wrong
URL or a missing token stops the run before it writes anything) and name the rewards it serves;
the score of an image is the server's weighted total of them. Prompts are checked by the server's
rewards (POST URL/check) before the run starts, as in-process rewards check theirs. The server's
identity (what it serves, fingerprinted: identity.py) is kept for the run to record and check on
resume. A batch is sent in as many requests as the limits the server states in /health require.
A video model's clips go whole, every frame (wire.py's `videos`), to a server whose /health says it
judges videos, with the run's reward.video_frames and frame_reduce; the server scores them as an
in-process RewardSet does (image rewards on the sampled frames, combined; clip rewards on the clip).

Each request is limited to `timeout_s` seconds and retried with back-off on connection errors
(transport.py); a server that dies mid-run becomes an error, the watchdog's RewardFailure, and the
run stops with a checkpoint of its last finished iteration.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards.endpoints import TOKEN_ENV, check_media, split_name
from solrl_core.rewards.transport import call
from solrl_core.rewards.wire import SCHEMA, encode_clips, encode_images, scores_from_json

DEFAULT_TIMEOUT_S = 600.0  # per request when reward.timeout_s is 0 (a request without a limit could hang the run)


class RemoteReward:
    """The weighted total of a reward server's rewards, image i against prompt i."""

    def __init__(self, name: str, timeout_s: float = 0.0, encoding: str = "uint8", token: str | None = None,
                 video_frames: int = 0, frame_reduce: str = "mean") -> None:
        _, self.url = split_name(name)
        self.name = name
        self.timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        self.encoding = encoding
        self.video_frames, self.frame_reduce = video_frames, frame_reduce
        self.token = os.environ.get(TOKEN_ENV, "") if token is None else token
        self.info, self.latency_s = self.health()
        identity = self.info.get("identity")
        self.identity: dict[str, Any] | None = identity if isinstance(identity, dict) else None
        media = self.info.get("media")  # a server without the field (an earlier version) judges images
        self.media: tuple[str, ...] = tuple(m for m in media if m in ("image", "video")) if isinstance(media,
                list) else ("image",)

    def health(self) -> tuple[dict[str, Any], float]:
        """The server's /health answer (checked: schema and rewards) and how long it took."""
        info, seconds = call(f"{self.url}/health", None, timeout_s=min(self.timeout_s, 30.0), token=self.token,
                             what=f"reward server {self.url}")
        if not isinstance(info, dict) or info.get("schema") != SCHEMA or not isinstance(info.get("rewards"), list) \
                or not info["rewards"]:
            raise SolrlError(f"{self.url}/health did not answer as a solrl reward server of schema {SCHEMA} "
                             f"({str(info)[:120]})",
                             "point remote: at a `solrl reward-server` of the same solrl version")
        return info, seconds

    @property
    def served(self) -> list[str]:
        """'name=weight' of each reward the server serves."""
        return [f"{r.get('name')}={r.get('weight')}" for r in self.info["rewards"]]

    def check_prompts(self, prompts: list[str]) -> None:
        call(f"{self.url}/check", {"prompts": prompts}, timeout_s=self.timeout_s, token=self.token, what=f"reward "
                                                                                                         f"server "
                                                                                                         f"{self.url}")

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """[B] float32 CPU scores for [B, 3, H, W] images, or [B, F, 3, H, W] clips, in [0, 1]."""
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        check_media(self.name, self.media, video=images.dim() == 5)
        if not prompts:
            return torch.zeros(0)
        step = self.images_per_request(images)
        return torch.cat([self._score(images[i:i + step], list(prompts[i:i + step]))
                          for i in range(0, len(prompts), step)])

    def images_per_request(self, images: torch.Tensor) -> int:
        """As many images (or clips) as the server's limits take in one request (its max_images,
        max_decoded_bytes; a clip's frames count as images)."""
        most = images.shape[0]
        frames = images.shape[1] if images.dim() == 5 else 1
        max_images, max_bytes = self.info.get("max_images"), self.info.get("max_decoded_bytes")
        if isinstance(max_images, int) and max_images > 0:
            most = min(most, max_images // frames)
        if isinstance(max_bytes, int) and max_bytes > 0:  # the server decodes every image to float32 [H, W, 3]
            most = min(most, max_bytes // (frames * 3 * 4 * images.shape[-2] * images.shape[-1]))
        if most < 1 and frames > 1:  # (one image over the limits is sent, and the server's 413 names them)
            raise SolrlError(f"one clip of {frames} frames of {images.shape[-2]}x{images.shape[-1]} is more than "
                             f"reward server {self.url} takes in one "
                             f"request", "start it with a larger --max-images and --max-decoded-mb, "
                             "or score fewer frames (reward.video_frames)")
        return max(1, most)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        if images.dim() == 5:
            body = {"prompts": prompts, "videos": encode_clips(images, self.encoding),
                    "video_frames": self.video_frames,
                    "frame_reduce": self.frame_reduce}
        else:
            body = {"prompts": prompts, "images": encode_images(images, self.encoding)}
        answer, _ = call(f"{self.url}/score", body, timeout_s=self.timeout_s, token=self.token, what=f"reward server "
                                                                                                     f"{self.url}")
        total = answer.get("total") if isinstance(answer, dict) else None
        return scores_from_json(total, len(prompts), f"reward server {self.url}")


def build_endpoint(name: str, settings: dict[str, str], timeout_s: float, video_frames: int = 0,
                   frame_reduce: str = "mean") -> Any:
    """The reward a remote:URL or vlm:URL name stands for, connected and checked (`video_frames`,
    `frame_reduce`: the frames of a clip an image reward scores, and how their scores combine)."""
    if name.startswith("vlm:"):
        from solrl_core.rewards.vlm import VlmJudge

        return VlmJudge(name, settings, timeout_s, video_frames)
    return RemoteReward(name, timeout_s, encoding=settings.get("encoding", "uint8"), video_frames=video_frames,
                        frame_reduce=frame_reduce)
