"""Which loaders make what, and the config rules that follow from it (Config.validate in schema.py):
a video loader has frames and video rewards, a tiny one no model path. Torch-free, like the schema."""

from __future__ import annotations

from typing import Any

from solrl_core.errors import SolrlError, close_matches
from solrl_core.rewards.names import FRAME_REDUCTIONS, check_media

T5_LOADERS = ("flux1", "sd3")  # the loaders that read model.max_sequence_length
VIDEO_LOADERS = ("wan", "tiny_video")  # the loaders whose samples are clips of model.frames frames
TINY_LOADERS = ("tiny", "tiny_video")  # built offline from model.weights or a random init: no hub id, no model.path


def check_frames(cfg: Any) -> None:
    """A video model has frames, an image model none, and each reward judges what the model makes."""
    video = cfg.model.loader in VIDEO_LOADERS
    if video and cfg.model.frames < 1:
        raise SolrlError(f"model.frames={cfg.model.frames}: the {cfg.model.loader} loader makes videos",
                         "set the clip length, e.g. --set model.frames=5 (a Wan preset sets it)")
    if not video and cfg.model.frames:
        raise SolrlError(f"model.frames={cfg.model.frames} applies to the video loaders ({', '.join(VIDEO_LOADERS)}), "
                         f"not to loader {cfg.model.loader}", "drop the setting")
    if cfg.reward.frame_reduce not in FRAME_REDUCTIONS:
        raise SolrlError(f"unknown reward.frame_reduce '{cfg.reward.frame_reduce}'",
                         close_matches(cfg.reward.frame_reduce, FRAME_REDUCTIONS))
    check_media(list(cfg.reward.weights), video)
    check_media(list(cfg.run.eval_rewards), video, knob="run.eval_rewards")


def check_model_path(model: Any) -> None:
    """--model-path names a folder that exists, for a model that reads one."""
    if not model.path:
        return
    if model.loader in TINY_LOADERS:
        raise SolrlError(f"the tiny model takes no --model-path (model.path={model.path}): it is built from "
                         f"model.weights "
                         "or a random init", "drop --model-path; for tiny weights use --set model.weights=FOLDER")
    import os

    if not os.path.isdir(os.path.expanduser(model.path)):
        raise SolrlError(f"model.path {model.path} does not exist" if not os.path.exists(os.path.expanduser(model.path))
                         else f"model.path {model.path} is not a folder",
                         "pass --model-path a local folder in the hub's diffusers layout, or drop it to use "
                         "model.hub_id")
