"""The reward server's wire format (schema 1): images and prompts in, scores out, JSON only.

Nothing is pickled: an image travels as base64 of PNG bytes, of raw uint8 pixels, or of raw float32
pixels, so a payload can never run code on the side that reads it.

    POST /score   {"prompts": ["a red circle", ...],
                   "images": [{"format": "uint8", "shape": [H, W, 3], "data": "<base64>"}, ...]}
                  -> {"total": [0.75, ...], "scores": {"tinyworld_geneval": [0.75, ...]}, "seconds": 0.01}

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
from typing import Any

import numpy as np
import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards.jpeg import to_uint8

SCHEMA = 1
FORMATS = ("uint8", "png", "float32")


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


def png_bytes(image: torch.Tensor) -> bytes:
    """One [3, H, W] image in [0, 1] as PNG bytes (what a VLM judge is sent)."""
    return _png(to_uint8(image[None])[0])


def _png(array: np.ndarray) -> bytes:
    """[H, W, 3] uint8 as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def decode_images(items: list[Any], max_pixels: int) -> torch.Tensor:
    """The JSON `images` list -> [B, 3, H, W] float32 in [0, 1]. Raises ValueError naming what is wrong."""
    if not isinstance(items, list) or not items:
        raise ValueError("'images' must be a non-empty list")
    arrays = [_decode_one(i, item, max_pixels) for i, item in enumerate(items)]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"all images of a request must share one size; got {sorted(shapes)}")
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _decode_one(i: int, item: Any, max_pixels: int) -> np.ndarray:
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
        return _decode_png(i, raw, max_pixels)
    shape = item.get("shape")
    if not (isinstance(shape, list) and len(shape) == 3 and shape[2] == 3 and all(isinstance(s, int) and s > 0 for s in shape)):
        raise ValueError(f"image {i}: 'shape' must be [H, W, 3] with positive integers, got {shape!r}")
    if shape[0] * shape[1] > max_pixels:
        raise ValueError(f"image {i}: {shape[0]}x{shape[1]} is more than the server's {max_pixels} pixels per image")
    itemsize = 4 if fmt == "float32" else 1
    expected = shape[0] * shape[1] * 3 * itemsize
    if len(raw) != expected:
        raise ValueError(f"image {i}: {len(raw)} bytes of data for shape {shape} in {fmt} (expected {expected})")
    if fmt == "uint8":
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape).astype(np.float32) / np.float32(255)
    values = np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    if not np.isfinite(values).all():
        raise ValueError(f"image {i}: float32 pixels must be finite")
    return values


def _decode_png(i: int, raw: bytes, max_pixels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as img:
            if img.format != "PNG":
                raise ValueError(f"image {i}: format 'png' but the data is {img.format}")
            if img.width * img.height > max_pixels:
                raise ValueError(f"image {i}: {img.height}x{img.width} is more than the server's {max_pixels} pixels per image")
            arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"image {i}: not a readable PNG ({exc})") from exc
    return arr.astype(np.float32) / np.float32(255)


def scores_to_json(scores: torch.Tensor) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in scores.float().tolist()]


def scores_from_json(values: Any, count: int, where: str) -> torch.Tensor:
    """A JSON list of `count` numbers (null = non-finite) -> float32 [count]; SolrlError otherwise."""
    if not isinstance(values, list) or len(values) != count or \
            not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
        raise SolrlError(f"{where} did not answer with {count} scores", "check that the URL is a `solrl reward-server` of the same version")
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")
