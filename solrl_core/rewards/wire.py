"""The reward server's wire format (schema 1): images and prompts in, scores out, JSON only.

Nothing is pickled: an image travels as base64 of PNG bytes, of raw uint8 pixels, or of raw float32
pixels, so a payload can never run code on the side that reads it.

    POST /score   {"prompts": ["a red circle", ...],
                   "images": [{"format": "uint8", "shape": [H, W, 3], "data": "<base64>"}, ...]}
                  -> {"total": [0.75, ...], "scores": {"tinyworld_geneval": [0.75, ...]}, "seconds": 0.01}

A video model's clips go as `videos` in place of `images`, each clip its frames in order, every frame
an image as above (all clips of a request of one frame count and size), with the frames of a clip an
image reward scores (`video_frames`, evenly spaced; 0, the default: every frame) and how their scores
make the clip's (`frame_reduce`: mean, the default, or min), as reward.video_frames and
reward.frame_reduce say in process (rewards/video.py); a reward of whole clips sees every frame:

    POST /score   {"prompts": [...], "video_frames": 0, "frame_reduce": "mean",
                   "videos": [{"frames": [{"format": "uint8", "shape": [H, W, 3], "data": "<base64>"}, ...]}, ...]}

The server's limits count frames as images (max_images, decoded bytes). /health says what the
server's rewards judge: "media": ["image"], ["video"] (a reward of whole clips, e.g.
temporal_consistency) or both; a server without the field judges images only.

format 'uint8': H*W*3 bytes, row-major HWC; 'float32': H*W*3 little-endian float32 values in
[0, 1], HWC; 'png': a PNG file (RGB or RGBA; alpha dropped). A uint8 or PNG image becomes the float
tensor v / 255, which quantises back to exactly v: the tiny-world and JPEG rewards (which score the
uint8 image) give the same scores as in process, bit for bit. Model rewards see the image as a
saved PNG would give it; float32 sends the exact floats for scores equal to in-process ones.
Scores are float32 values written as JSON numbers (exact), null for a non-finite score.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from solrl_core.errors import SolrlError
from solrl_core.io.images import to_uint8

SCHEMA = 1
FORMATS = ("uint8", "png", "float32")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PIXEL_CHUNKS = (b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND")  # what a PNG's pixels are made of


def encode_images(images: torch.Tensor, encoding: str) -> list[dict[str, Any]]:
    """[B, 3, H, W] floats in [0, 1] -> the JSON `images` list in `encoding`."""
    if encoding == "float32":
        arrays = images.detach().float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy().astype("<f4")
        return [{"format": "float32", "shape": list(a.shape), "data": _b64(a.tobytes())} for a in arrays]
    out = []
    for a in to_uint8(images):
        if encoding == "png":
            out.append({"format": "png", "data": _b64(_png(a))})
        else:
            out.append({"format": "uint8", "shape": list(a.shape), "data": _b64(np.ascontiguousarray(a).tobytes())})
    return out


def encode_clips(clips: torch.Tensor, encoding: str) -> list[dict[str, Any]]:
    """[B, F, 3, H, W] floats in [0, 1] -> the JSON `videos` list, each frame in `encoding`."""
    return [{"frames": encode_images(clip, encoding)} for clip in clips]


def decode_clips(items: Any, max_side: int, max_bytes: int) -> torch.Tensor:
    """The JSON `videos` list -> [B, F, 3, H, W] float32 in [0, 1] (read_clips, then decoded)."""
    return read_clips(items, max_side, max_bytes).decode()


def read_clips(items: Any, max_side: int, max_bytes: int) -> Pending:
    """The JSON `videos` list read as read_images reads images, every frame checked as an image is
    (the size limits count all frames of the request). Raises ValueError naming what is wrong."""
    if not isinstance(items, list) or not items:
        raise ValueError("'videos' must be a non-empty list")
    if not all(isinstance(v, dict) and isinstance(v.get("frames"), list) and v["frames"] for v in items):
        raise ValueError("each video must be an object with 'frames', a non-empty list of images")
    counts = {len(v["frames"]) for v in items}
    if len(counts) > 1:
        raise ValueError(f"all videos of a request must have one frame count; got {sorted(counts)}")
    return Pending(read_images([f for v in items for f in v["frames"]], max_side, max_bytes).headers, clips=len(items))


def frame_count(items: Any) -> int:
    """Frames in a JSON `videos` list, as far as it is well formed (for the images-per-request limit)."""
    return sum(len(v["frames"]) for v in items if isinstance(v, dict) and isinstance(v.get("frames"), list)) \
        if isinstance(items, list) else 0


def png_bytes(image: torch.Tensor) -> bytes:
    """One [3, H, W] image in [0, 1] as PNG bytes (what a VLM judge is sent)."""
    return _png(to_uint8(image[None])[0])


def _png(array: np.ndarray) -> bytes:
    """[H, W, 3] uint8 as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


class TooLarge(ValueError):
    """A request over the server's size limits (HTTP 413), found before anything was decoded."""


@dataclass(frozen=True)
class Pending:
    """A request's images read up to their headers and checked against the limits, nothing decoded:
    (format, raw bytes, height, width) each; `clips` > 0: they are the frames of that many clips."""

    headers: list[tuple[str, bytes, int, int]]
    clips: int = 0

    @property
    def decoded_bytes(self) -> int:
        """What decode() allocates: float32 [H, W, 3] per image."""
        return sum(h * w * 3 * 4 for _, _, h, w in self.headers)

    def decode(self) -> torch.Tensor:
        """[B, 3, H, W] (clips: [B, F, 3, H, W]) float32 in [0, 1]. Each image is decoded into its
        place in the one tensor returned, so the request costs its decoded bytes plus one image's
        uint8 pixels at a time, not a second and third copy of the whole batch."""
        _, _, height, width = self.headers[0]
        out = torch.empty(len(self.headers), 3, height, width)
        target = out.numpy()  # the same memory
        for i, (fmt, raw, h, w) in enumerate(self.headers):
            target[i] = (_decode_png(i, raw) if fmt == "png" else _decode_raw(fmt, raw, h, w)).transpose(2, 0, 1)
            if fmt == "float32":
                if not bool(torch.isfinite(out[i]).all()):
                    raise ValueError(f"image {i}: float32 pixels must be finite")
            else:
                out[i].div_(255)  # exactly numpy's float32 v / 255: a uint8 image quantises back to itself
        return out.view(self.clips, -1, *out.shape[1:]) if self.clips else out


def decode_images(items: list[Any], max_side: int, max_bytes: int) -> torch.Tensor:
    """The JSON `images` list -> [B, 3, H, W] float32 in [0, 1] (read_images, then decoded)."""
    return read_images(items, max_side, max_bytes).decode()


def read_images(items: list[Any], max_side: int, max_bytes: int) -> Pending:
    """The JSON `images` list, each image's size read and checked, nothing decoded. Raises
    ValueError naming what is wrong, TooLarge past `max_bytes`.

    Every image's size is read first (a raw image's declared `shape`, a PNG's header) and checked
    against `max_side` per side and `max_bytes` of decoded float32 pixels for the whole request;
    only then is anything decoded. A PNG of a few KiB can declare 4096x4096 (it compresses rows of
    zeros 1000:1) and would cost 200 MB once decoded."""
    if not isinstance(items, list) or not items:
        raise ValueError("'images' must be a non-empty list")
    headers = [_header(i, item, max_side) for i, item in enumerate(items)]
    sizes = {(h, w) for _, _, h, w in headers}
    if len(sizes) > 1:
        raise ValueError(f"all images of a request must share one size; got {sorted(sizes)}")
    pending = Pending(headers)
    if pending.decoded_bytes > max_bytes:
        raise TooLarge(f"{len(items)} images of {headers[0][2]}x{headers[0][3]} decode to {pending.decoded_bytes} "
                       f"bytes; the server takes at most {max_bytes} per request")
    return pending


def _header(i: int, item: Any, max_side: int) -> tuple[str, bytes, int, int]:
    """(format, raw bytes, height, width) of one image, its size checked; nothing decoded."""
    if not isinstance(item, dict):
        raise ValueError(f"image {i} is not an object with 'format' and 'data'")
    fmt, data = item.get("format"), item.get("data")
    if fmt not in FORMATS:
        raise ValueError(f"image {i}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    if not isinstance(data, str):
        raise ValueError(f"image {i}: 'data' must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"image {i}: 'data' is not valid base64 ({exc})") from exc
    if fmt == "png":
        raw, height, width = _png_still(i, raw)
    else:
        shape = item.get("shape")
        # bool is an int in Python: [true, true, 3] must not pass for a 1x1 image
        if not (isinstance(shape, list) and len(shape) == 3 and shape[2] == 3
                and all(type(s) is int and s > 0 for s in shape)):
            raise ValueError(f"image {i}: 'shape' must be [H, W, 3] with positive integers, got {str(shape)[:80]}")
        height, width = shape[0], shape[1]
    if max(height, width) > max_side:
        raise ValueError(f"image {i}: {height}x{width} is larger than the server's {max_side} pixels per side")
    if fmt != "png":
        expected = height * width * 3 * (4 if fmt == "float32" else 1)
        if len(raw) != expected:
            raise ValueError(f"image {i}: {len(raw)} bytes of data for shape {[height, width, 3]} in {fmt} (expected "
                             f"{expected})")
    return fmt, raw, height, width


def _png_still(i: int, raw: bytes) -> tuple[bytes, int, int]:
    """(the PNG's critical chunks, height, width), from its chunk headers, read before PIL sees the
    file (PIL's own bomb check, at Image.MAX_IMAGE_PIXELS, would answer first with its own words).
    Only the chunks that make the pixels are kept: PIL would otherwise inflate each compressed text
    or colour-profile chunk as it opens the file, up to 64 MiB of them per image. An animated PNG is
    refused: its frames past the first would never be scored."""
    if raw[:8] != PNG_SIGNATURE or raw[12:16] != b"IHDR" or len(raw) < 24:
        raise ValueError(f"image {i}: not a readable PNG (no PNG signature and IHDR header)")
    width, height = struct.unpack(">II", raw[16:24])
    if not (width and height):
        raise ValueError(f"image {i}: not a readable PNG (its header declares {height}x{width})")
    kept, pos = [PNG_SIGNATURE], 8
    while pos + 8 <= len(raw):
        length, tag = struct.unpack(">I4s", raw[pos:pos + 8])
        if tag == b"acTL":
            frames = struct.unpack(">I", raw[pos + 8:pos + 12])[0] if pos + 12 <= len(raw) else "several"
            raise ValueError(f"image {i}: an animated PNG ({frames} frames); send each frame as an image of its own "
                             "(a clip's frames as 'videos')")
        if tag in PIXEL_CHUNKS:
            kept.append(raw[pos:pos + 12 + length])  # a truncated chunk stays truncated: PIL's error names it
        pos += 12 + length
        if tag == b"IEND":
            break
    return b"".join(kept), height, width


def _decode_raw(fmt: str, raw: bytes, height: int, width: int) -> np.ndarray:
    """[H, W, 3] uint8 or float32 pixels: a view of `raw`, not a copy."""
    return np.frombuffer(raw, dtype=np.uint8 if fmt == "uint8" else "<f4").reshape(height, width, 3)


def _decode_png(i: int, raw: bytes) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw), formats=["PNG"]) as img:
            return np.asarray(img if img.mode == "RGB" else img.convert("RGB"), dtype=np.uint8)
    # a header that passed, a body that does not
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ValueError(f"image {i}: not a readable PNG ({type(exc).__name__}: {exc})") from exc


def scores_to_json(scores: torch.Tensor) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in scores.float().tolist()]


def scores_from_json(values: Any, count: int, where: str) -> torch.Tensor:
    """A JSON list of `count` numbers (null = non-finite) -> float32 [count]; SolrlError otherwise."""
    if not isinstance(values, list) or len(values) != count or \
            not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
        raise SolrlError(f"{where} did not answer with {count} scores", "check that the URL is a `solrl reward-server` "
                                                                        "of the same version")
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")
