"""How a video model's clips are looked at: a clip [F, 3, H, W] laid out as its frames in a row (the
contact sheet every grid and PNG of a clip shows), and written as a video file: MP4 (H.264) where
the `video` extra is installed (imageio with imageio-ffmpeg's bundled ffmpeg, imported only here and
only when a clip is written), else an animated GIF through PIL. Images [3, H, W] pass through
unchanged, so the grids and PNG writers take either. A video file's frames are enlarged to at least
128 pixels a side (MIN_SIDE)."""

from __future__ import annotations

from pathlib import Path

import torch

GIF_FPS = 16  # Wan 2.1's frame rate (WanPipeline's export_to_video example writes fps=16)
# a clip of a few frames (the tiny video model's 4) at 16 fps would flash by in a quarter of a second
MIN_LOOP_SECONDS = 1.0


def frame_rate(frames: int, fps: float = GIF_FPS) -> float:
    """Frames a second to play a clip at: `fps`, slowed so that one pass lasts at least MIN_LOOP_SECONDS
    (4 frames: 4 a second, 250 ms each; Wan's 81 frames keep 16 a second)."""
    return min(float(fps), max(frames, 1) / MIN_LOOP_SECONDS)


MIN_SIDE = 128  # pixels: a smaller clip (the tiny video model's 16) is written enlarged to at least this a side


def enlargement(h: int, w: int, min_side: int = MIN_SIDE) -> int:
    """The whole factor that brings an image's shorter side to at least `min_side` pixels (nearest:
    every pixel a square block, nothing blurred); 1 for an image as large already."""
    return max(1, -(-min_side // max(1, min(h, w))))


def still(item: torch.Tensor) -> torch.Tensor:
    """One sample as an image: a clip [F, 3, H, W] as its frames in a row [3, H, F * W]; an image
    [3, H, W] as it is."""
    return torch.cat(list(item), dim=-1) if item.dim() == 4 else item


def stills(batch: torch.Tensor) -> torch.Tensor:
    """A batch as images: clips [B, F, 3, H, W] as [B, 3, H, F * W]; images [B, 3, H, W] as they are."""
    return torch.cat(list(batch.unbind(1)), dim=-1) if batch.dim() == 5 else batch


def side_by_side(clips: torch.Tensor) -> torch.Tensor:
    """Clips [N, F, 3, H, W] as one clip [F, 3, H, N * W], the first on the left (one video of a grid's
    clips, as TensorBoard's add_video tiles a batch)."""
    return torch.cat(list(clips), dim=-1)


def mp4_available() -> bool:
    """Whether clips can be written as MP4: imageio and its ffmpeg binary (pip install 'solrl[video]')."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("imageio", "imageio_ffmpeg"))


def save_clip(clip: torch.Tensor, stem: Path, fps: int = GIF_FPS) -> Path:
    """A clip [F, 3, H, W] in [0, 1] as `stem`.mp4, or `stem`.gif without the video extra; returns the file."""
    if not mp4_available():
        save_gif(clip, stem.with_suffix(".gif"), fps)
        return stem.with_suffix(".gif")
    import imageio.v2 as imageio

    path = stem.with_suffix(".mp4")
    # quality 8 of 10 (imageio's default 5 blurs small clips); frames whose sides are not multiples of 16
    # are padded up by imageio, as H.264 with yuv420p needs even sides.
    with imageio.get_writer(path, fps=frame_rate(len(clip), fps), codec="libx264", quality=8,
                            macro_block_size=16) as writer:
        for frame in clip:
            writer.append_data(_uint8(frame))
    return path


def save_gif(clip: torch.Tensor, path: Path, fps: int = GIF_FPS) -> None:
    """A clip [F, 3, H, W] in [0, 1] as an animated GIF that loops."""
    Path(path).write_bytes(gif_bytes(clip, fps))


def gif_bytes(clip: torch.Tensor, fps: int = GIF_FPS) -> bytes:
    """A clip [F, 3, H, W] in [0, 1] as the bytes of an animated GIF."""
    import io

    from PIL import Image

    frames = [Image.fromarray(_uint8(f)) for f in clip]
    out = io.BytesIO()
    duration = round(1000 / frame_rate(len(frames), fps))
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=duration, loop=0)
    return out.getvalue()


def read_clip(path: Path) -> torch.Tensor:
    """A clip file this module wrote (MP4 through the video extra, or GIF) back as [F, 3, H, W] in [0, 1]."""
    import numpy as np

    if Path(path).suffix == ".gif":
        from PIL import Image, ImageSequence

        with Image.open(path) as gif:
            frames = np.stack([np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(gif)])
    else:
        import imageio.v3 as iio

        frames = iio.imread(path)
    return torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255


def _uint8(image: torch.Tensor):  # noqa: ANN202 - numpy array [H, W, 3]
    """A frame as it is written to a video file: enlarged to MIN_SIDE pixels a side (a 16 px clip is a
    blur a player scales up, or a speck it does not)."""
    frame = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    k = enlargement(*frame.shape[:2])
    return frame.repeat(k, axis=0).repeat(k, axis=1) if k > 1 else frame
