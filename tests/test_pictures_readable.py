"""Pictures a person reads: whole captions in a TrueType font, rewards labelled, tiles large enough to see
a shape, the same for clips' contact sheets, and video files no smaller than 128 pixels a side."""

from __future__ import annotations

import numpy as np
import torch

from solrl_core.io.images import font, grid_rows, make_grid, wrap
from solrl_core.io.video_output import MIN_SIDE, read_clip, save_gif
from solrl_core.loop.eval_pictures import reward_captions


def test_the_font_is_a_truetype_face_of_readable_size():
    from PIL import ImageFont

    face = font()
    assert isinstance(face, ImageFont.FreeTypeFont) and face.size >= 12
    # the bitmap default ran words together ("leftofa"): a space here is as wide as a narrow letter at least
    assert face.getlength("left of a") >= face.getlength("leftofa") + 2 * face.getlength("i")


def test_a_long_prompt_is_wrapped_whole_in_the_label_column():
    prompt = "a yellow circle left of a red square"
    (label,) = grid_rows([prompt], [1000001075])
    grid = make_grid({"base": torch.zeros(1, 3, 32, 32), "ema": torch.zeros(1, 3, 32, 32)}, rows=[label],
                     captions={"base": ["reward 0.5"], "ema": ["reward 0.5 -> 1"]})
    assert " ".join(wrap(label, font(), 240 - 8)) == label  # every word kept, none cut to '...'
    assert grid.height >= 128 and grid.width >= 240 + 2 * 128


def test_eval_picture_captions_name_the_reward_and_its_change():
    assert reward_captions([1.0, 0.75], [0.5, 0.75]) == ["reward 0.5 -> 1", "reward 0.75 -> 0.75"]
    assert reward_captions([1.0], []) == ["reward 1"]  # a resumed run's regenerated base has no reward


def test_a_tiny_clip_contact_sheet_has_tiles_a_shape_can_be_seen_in():
    clip = torch.zeros(1, 4, 3, 16, 16)
    clip[..., 0, 4:12, 4:12] = 1.0  # a red square in each 16 px frame
    grid = np.asarray(make_grid({"base": clip}))
    red = (grid[..., 0] > 200) & (grid[..., 1] < 50)
    rows = np.nonzero(red.any(axis=1))[0]
    assert rows.max() - rows.min() + 1 >= 64  # the 8 px square drawn at least 64 px tall (16 px frames -> 128)


def test_a_tiny_clip_is_written_at_least_128_pixels_a_side(tmp_path):
    clip = torch.rand(4, 3, 16, 16)
    save_gif(clip, tmp_path / "c.gif")
    back = read_clip(tmp_path / "c.gif")
    assert back.shape[-2:] == (MIN_SIDE, MIN_SIDE) == (128, 128)
