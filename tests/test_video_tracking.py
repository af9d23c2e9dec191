"""A video model's training sample grid on a tiny random WanPipeline: the contact sheets (frames in a
row, each captioned with its seed) and the clips themselves side by side as one video, read back
from TensorBoard's event file (the animated GIF add_video writes), handed to W&B as a wandb.Video,
and named on the TUI's log line."""

from __future__ import annotations

import io

import pytest
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.engine.rollout import RolloutBatch
from solrl_core.tracking.samples import sample_grid
from tests.helpers import WAN_FAST as FAST, WAN_NAME as NAME
from tests.tiny_pipelines import save_tiny_pipeline


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """One iteration's sample grid of three clips of one prompt, with the video extra (MP4) and without (GIF)."""
    from solrl_core.engine.engine import open_engine

    folder = save_tiny_pipeline(NAME, tmp_path_factory.mktemp("wan") / NAME)
    engine = open_engine(resolve_config(NAME, "sol_rl", sets=[*FAST, f"model.path={folder}"]))
    seeds = torch.tensor([7, 8, 9])
    made = engine.generate(engine.conditioning(["a red circle"] * 3), seeds, 2, "base")
    batch = RolloutBatch(prompts=["a red circle"] * 3, groups=torch.zeros(3, dtype=torch.long), seeds=seeds,
                         latents=made.latents, sigmas=made.sigmas, rewards=torch.tensor([0.1, 0.3, 0.2]), components={},
                         seconds_reward=0.0)
    return engine, batch, tmp_path_factory.mktemp("run")


@pytest.mark.parametrize("mp4", [True, False], ids=["mp4", "gif"])
def test_a_video_sample_grid_is_contact_sheets_and_one_video_for_the_trackers(grid, mp4, monkeypatch):
    from PIL import Image

    from solrl_view.words import log_line
    from solrl_core.io import video_output
    from solrl_core.tracking.tensorboard_log import TensorBoardLog
    from solrl_core.tracking.wandb_log import WandbLog

    if mp4:
        pytest.importorskip("imageio_ffmpeg")
    else:
        monkeypatch.setattr(video_output, "mp4_available", lambda: False)
    engine, batch, run_dir = grid
    run_dir = run_dir / ("mp4" if mp4 else "gif")
    event = sample_grid(engine, batch, run_dir, iteration=3)
    assert event.seeds == [8, 9, 7] and event.rewards == pytest.approx([0.3, 0.2, 0.1])  # best first
    assert event.video == str(run_dir / "samples" / ("iter_000003.mp4" if mp4 else "iter_000003.gif"))
    clip = video_output.read_clip(event.video)
    assert clip.shape == (5, 3, 128, 3 * 128)  # five frames, the three clips side by side, enlarged to 128 px a side
    best = engine.decode(batch.latents[1:2])[0]  # seed 8, leftmost
    shrunk = torch.nn.functional.avg_pool2d(clip[:, :, :, :128], 4)  # each pixel written as a 4x4 block
    assert (shrunk - best).abs().mean() < 0.05  # lossy codecs: close, not equal
    with Image.open(event.path) as sheet:  # three cells, each a clip's five frames in a row, a caption line under them
        assert sheet.width > 3 * 5 * 128 and 128 + 12 < sheet.height <= 2 * 128

    tb = TensorBoardLog(run_dir, {"run": {}}, resumed=False, start_iteration=0)
    tb(event)
    tb.close("completed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    acc.Reload()
    assert {"samples", "samples/video"} <= set(acc.Tags()["images"])
    (played,) = acc.Images("samples/video")
    assert played.step == 3 and (played.width, played.height) == (384, 128)  # as written: 128 px a side at least
    with Image.open(io.BytesIO(played.encoded_image_string)) as gif:
        assert gif.format == "GIF" and gif.n_frames == 5 and gif.size == (384, 128)

    logged = []
    wb = WandbLog.__new__(WandbLog)  # W&B's own media classes on a stand-in run (no W&B process, no network)
    import wandb

    wb._wandb, wb.run = wandb, type("Run", (), {"log": lambda self, media, step: logged.append((media, step))})()
    wb(event)
    ((media, step),) = logged
    assert step == 3 and isinstance(media["samples"], wandb.Image) and isinstance(media["samples/video"], wandb.Video)
    assert media["samples/video"]._format == event.video[-3:] and "seeds 8, 9, 7" in media["samples/video"]._caption
    assert f"the clips: {event.video}" in log_line(event)


def test_an_image_sample_grid_writes_no_video(fast_sets, tmp_path):
    from solrl_core.engine.engine import open_engine

    engine = open_engine(resolve_config("tiny", "sol_rl", sets=fast_sets()))
    made = engine.generate(engine.conditioning(["a red circle"] * 2), torch.tensor([1, 2]), 2, "base")
    batch = RolloutBatch(prompts=["a red circle"] * 2, groups=torch.zeros(2, dtype=torch.long),
                         seeds=torch.tensor([1, 2]),
                         latents=made.latents, sigmas=made.sigmas, rewards=torch.tensor([0.1, 0.3]), components={},
                         seconds_reward=0.0)
    event = sample_grid(engine, batch, tmp_path, iteration=1)
    assert event.video == "" and event.seeds == [2,
            1] and sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["iter_000001.png"]
