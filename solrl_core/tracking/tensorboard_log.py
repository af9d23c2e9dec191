"""TensorBoard event files under RUN/tensorboard/, written with torch's SummaryWriter.

A video model's sample clips go to `samples/video` as the summary `add_video` writes (an animated
GIF in an image summary, which TensorBoard's image dashboard plays), encoded here through PIL:
`add_video` itself needs moviepy's 1.x `moviepy.editor`, which moviepy 2 removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from solrl_core import events as ev
from solrl_core.tracking.base import Tracker, caption

FOLDER = "tensorboard"


class TensorBoardLog(Tracker):
    def __init__(self, run_dir: Path, config: dict[str, Any], resumed: bool, start_iteration: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # On resume, steps after the checkpoint were logged by the run that stopped and will be logged
        # again: purge_step tells TensorBoard to drop the old ones, so each series stays one line.
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / FOLDER),
                                    purge_step=start_iteration + 1 if resumed else None)
        self.writer.add_text("config", "```\n" + tomli_w.dumps(config) + "```", start_iteration)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # a few events per iteration: a dashboard watching the run sees each one at once

    def image(self, grid: ev.SampleGrid) -> None:
        from PIL import Image

        with Image.open(grid.path) as picture:
            pixels = np.asarray(picture.convert("RGB"))
        self.writer.add_image("samples", pixels, grid.iteration, dataformats="HWC")
        self.writer.add_text("samples/caption", caption(grid), grid.iteration)
        if grid.video:
            self.writer.file_writer.add_summary(video_summary("samples/video", Path(grid.video)), grid.iteration)

    def close(self, reason: str) -> None:
        self.writer.close()


def video_summary(tag: str, path: Path):  # noqa: ANN201 - a TensorBoard Summary
    """A clip file (GIF, or MP4 read back through the video extra) as the summary add_video writes."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    from solrl_core.io.video_output import gif_bytes, read_clip

    clip = read_clip(path)
    encoded = path.read_bytes() if path.suffix == ".gif" else gif_bytes(clip)
    image = Summary.Image(height=clip.shape[2], width=clip.shape[3], colorspace=3, encoded_image_string=encoded)
    return Summary(value=[Summary.Value(tag=tag, image=image)])
