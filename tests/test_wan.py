"""Wan 2.1 text-to-video on a tiny random WanPipeline of the real architecture (WanTransformer3DModel,
AutoencoderKLWan, a UMT5 encoder with a local tokenizer), saved in the hub's diffusers layout and
loaded back through the loader a hub download takes, and a tiny Wan 2.2 TI2V pipeline likewise:
rollout parity with WanPipeline, the explore copy's layer rule on the published configurations, `solrl explore`, one
sol_rl iteration with an
image reward scored on frames, resume, the exported LoRA in WanPipeline.load_lora_weights, and
`solrl infer`'s GIFs and contact sheets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine.sampler import noise_for_seeds, sample, sigma_grid
from solrl_core.errors import SolrlError
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.models import load_model
from tests.tiny_pipelines import save_tiny_pipeline
from tests.helpers import WAN_FAST as FAST, WAN_NAME as NAME

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_pipeline(NAME, tmp_path_factory.mktemp("wan") / NAME)


@pytest.fixture(scope="module")
def folders(folder, tmp_path_factory):
    """Per preset, its tiny pipeline: the Wan 2.1 presets share one architecture, Wan 2.2 TI2V has its own."""
    ti2v = save_tiny_pipeline("wan22_ti2v_5b", tmp_path_factory.mktemp("wan22") / "wan22_ti2v_5b")
    return {NAME: folder, "wan21_t2v_14b": folder, "wan22_ti2v_5b": ti2v}


@pytest.mark.parametrize("name, latent_shape", [(NAME, (4, 2, 4, 4)), ("wan21_t2v_14b", (4, 2, 4, 4)),
                                                 ("wan22_ti2v_5b", (48, 2, 2, 2))])
def test_rollout_matches_wan_pipeline(name, latent_shape, folders):
    # Same prompt, same noise, same sigmas: encode + velocity + Euler + decode give WanPipeline's own
    # latents and frames. Pins the timestep scale (sigma * 1000; per token for Wan 2.2 TI2V), the padded
    # UMT5 embeddings, the latent frame count and the VAE's latents_mean / latents_std.
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    folder = folders[name]
    model = load_model(resolve_config(name, "sol_rl", sets=[*FAST, f"model.path={folder}"]).model, CPU, torch.float32)
    assert model.latent_shape == latent_shape and model.frames == 5 and model.media == "video"
    prompts = ["a red circle", "two blue squares"]
    noise = noise_for_seeds([3, 4], model.latent_shape, CPU)
    sigmas = sigma_grid(2, 1.0, "scheduler")  # FlowMatchEulerDiscreteScheduler().set_timesteps(2)
    ours = sample(lambda x, s, c: model.velocity(model.transformer, x, s, c), noise, model.encode(prompts), sigmas)
    pipe = WanPipeline.from_pretrained(str(folder))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler()
    kwargs = dict(num_inference_steps=2, guidance_scale=1.0, height=32, width=32, num_frames=5, latents=noise)
    theirs = pipe(prompt=list(prompts), output_type="latent", **kwargs)[0]
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    frames = pipe(prompt=list(prompts), output_type="pt", **kwargs)[0]  # [B, F, 3, H, W] in [0, 1]
    clips = model.decode(ours)
    assert clips.shape == (2, 5, 3, 32, 32)
    assert torch.allclose(clips, frames, atol=1e-4), (clips - frames).abs().max()


@pytest.mark.parametrize("name, heads, ffn, layers, channels, size", [
    (NAME, 12, 8960, 30, 16, 1.42), ("wan21_t2v_14b", 40, 13824, 40, 16, 14.29), ("wan22_ti2v_5b", 24, 14336, 30, 48,
                                                                                  5.0)])
def test_the_explore_rule_quantizes_every_block_linear_of_the_published_models(name, heads, ffn, layers, channels,
                                                                               size):
    import diffusers

    from solrl_core.plan.footprint import model_size
    from solrl_core.precision.quantize import LayerRule, plan_layers

    with torch.device("meta"):  # transformer/config.json of Wan-AI/Wan2.1-T2V-1.3B, -14B and Wan2.2-TI2V-5B-Diffusers
        model = diffusers.WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=128, in_channels=channels,
                                                out_channels=channels,
            text_dim=4096, freq_dim=256, ffn_dim=ffn, num_layers=layers, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
    cfg = resolve_config(name, "sol_rl")
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == size == model_size(cfg).transformer_b
    assert model_size(cfg).label.startswith("Wan")
    entries = plan_layers(model, LayerRule.of(cfg.model))
    kept = {e.name.split(".")[0] for e in entries if not e.quantized}
    quantized = {".".join(e.name.split(".")[2:]) for e in entries if e.quantized}
    assert kept == {"condition_embedder", "proj_out"}  # the patch embedding is a Conv3d: never a GEMM here
    assert all(e.name.startswith("blocks.") for e in entries if e.quantized)
    assert quantized == {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                         "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"}


def test_frames_and_rewards_must_fit_the_model():
    with pytest.raises(SolrlError, match="model.frames=6 does not fit the Wan VAE"):
        from solrl_core.models.wan import latent_frames

        latent_frames(6, 4)
    with pytest.raises(SolrlError, match="the wan loader makes videos"):
        resolve_config(NAME, "sol_rl", sets=["model.frames=0"]).validate()
    with pytest.raises(SolrlError, match="applies to the video loaders"):
        resolve_config("sana", "sol_rl", sets=["model.frames=5"]).validate()
    with pytest.raises(SolrlError, match="tinyworld_geneval' judges only the tiny world's still images") as err:
        resolve_config(NAME, "sol_rl", "tinyworld_geneval").validate()
    assert "\n" not in str(err.value)
    with pytest.raises(SolrlError, match="unknown reward.frame_reduce 'median'"):
        resolve_config(NAME, "sol_rl", sets=["reward.frame_reduce=median"]).validate()
    resolve_config(NAME, "sol_rl", "imagereward").validate()  # an image reward on a video model: scored on frames


@pytest.mark.parametrize("name", [NAME, "wan22_ti2v_5b"])
def test_explore_writes_ranked_seeds_and_a_contact_sheet_grid(name, folders, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from solrl_cli.app import app

    monkeypatch.chdir(tmp_path)
    sets = [a for s in FAST if not s.startswith(("explore.group_size", "selection.group_size")) for a in ("--set", s)]
    result = CliRunner().invoke(app, ["explore", "--model", name, "--model-path", str(folders[name]), "--reward",
                                      "jpeg_compressibility",
                                      "--prompts", "tiny", "--n", "4", "--k", "2", "--out", "ex", *sets])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "ex" / "seeds.jsonl").read_text().splitlines()]
    assert len(rows) % 4 == 0 and sum(r["selected"] for r in rows) == len(rows) // 2
    from PIL import Image

    with Image.open(tmp_path / "ex" / "grid.png") as grid:  # each cell a clip's 5 frames in a row
        assert grid.width > 2 * 5 * 32
    # The grid's clips (each prompt's best and worst) written as videos, named in their rows.
    from solrl_core.io.video_output import read_clip

    shown = [r for r in rows if "video" in r]
    assert len(shown) == 2 * len(rows) // 4 and {r["rank"] for r in shown} == {1, 4}
    for row in shown:
        assert row["video"] == f"clips/{rows.index(row) // 4:03d}_seed{row['seed']}{row['video'][-4:]}"
        assert read_clip(tmp_path / "ex" / row["video"]).shape == (5, 3, 128, 128)  # enlarged to 128 px a side
    assert "the grid's clips" in result.output


def test_rank_check_compares_the_explore_copys_clip_ranking_with_full_precision(folder, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from solrl_cli.app import app

    monkeypatch.chdir(tmp_path)
    sets = [a
            for s in ("model.resolution=32", "run.device=cpu", "run.threads=2", "sampler.rollout_batch=4",
                      "model.quant_min_dim=0")
            for a in ("--set", s)]
    result = CliRunner().invoke(app, ["rank-check", "--model", NAME, "--model-path", str(folder), "--reward",
                                      "jpeg_compressibility",
                                      "--prompts", "tiny", "--count", "1", "--seeds", "4", "--hit-k", "1",
                                      "--preview-steps", "1",
                                      "--full-steps", "2", "--out", "rc", *sets])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "rc" / "rank_check.json").read_text())
    assert data["arms"] == ["nvfp4-emulated@1", "nvfp4-emulated@2", "fp32@1", "fp32@2"]
    assert np.array(data["rewards"]["fp32@2"]).shape == (1, 4)
    # The quantized copy changes the clips (so its ranking is a real measurement, not the reference's own).
    assert data["rewards"]["nvfp4-emulated@2"] != data["rewards"]["fp32@2"]


@pytest.mark.parametrize("mp4", [True, False], ids=["mp4", "gif"])
def test_infer_writes_each_clip_as_a_video_and_a_contact_sheet(mp4, folder, tmp_path, monkeypatch):
    from PIL import Image
    from typer.testing import CliRunner

    from solrl_cli.app import app
    from solrl_core.io import video_output

    if mp4:
        pytest.importorskip("imageio_ffmpeg")  # the video extra (in dev)
    else:  # a machine without the video extra: GIFs
        monkeypatch.setattr(video_output, "mp4_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["infer", "--model", NAME, "--model-path", str(folder), "--prompt", "a red circle",
                                      "--seeds", "2", "--steps", "2", "--out", "clips", "--set", "model.resolution=32",
                                      "--set", "run.device=cpu"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "clips" / "images.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == [0, 1]
    for row in rows:
        video = tmp_path / "clips" / row["video"]
        assert video.suffix == (".mp4" if mp4 else ".gif")
        if mp4:
            import imageio.v3 as iio

            # five frames read back, 32 px enlarged to 128 (MIN_SIDE)
            assert iio.imread(video).shape == (5, 128, 128, 3)
        else:
            with Image.open(video) as gif:
                assert gif.n_frames == 5 and gif.size == (128, 128)
        with Image.open(tmp_path / "clips" / row["path"]) as sheet:
            assert sheet.size == (5 * 32, 32)  # the five frames in a row
    with Image.open(tmp_path / "clips" / "grid.png") as grid:
        assert grid.width > 5 * 32


@pytest.mark.slow  # 8 to 37 s each on a shared 2-core CPU: a run, a resume, two exports and two pipeline runs
@pytest.mark.parametrize("name", [NAME, "wan22_ti2v_5b"])
def test_one_iteration_resumes_and_exports_a_lora_wan_pipeline_loads(name, folders, tmp_path, monkeypatch):
    from diffusers import WanPipeline, WanTransformer3DModel
    from typer.testing import CliRunner

    from solrl_cli.app import app

    # run.seed=1, as the image models' test: a seed whose two kept clips do not tie on JPEG size.
    sets = [f"run.run_dir={tmp_path / 'run'}", "run.seed=1", "run.checkpoint_every=1"]
    seen: list[object] = []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    folder = folders[name]
    session = train(resolve_config(name, "sol_rl", "jpeg_compressibility", sets=[*FAST, f"model.path={folder}", *sets]),
                    bus,
                    stop=StopFlag())
    (it,) = [e for e in seen if isinstance(e, ev.IterationFinished)]
    assert np.isfinite(it.loss["loss"]) and it.final.std > 0 and it.grad_norm > 0, "nothing was trained"
    report = json.loads((tmp_path / "run" / "quantization_report.json").read_text())
    quantized = {e["name"] for e in report["entries"] if e["quantized"]}
    assert "blocks.0.ffn.net.0.proj" in quantized and "blocks.1.attn1.to_q" in quantized, report["skipped_by_rule"]
    assert (tmp_path / "run" / "checkpoints" / "iter_000001" / "pytorch_lora_weights.safetensors").is_file()

    resumed: list[object] = []
    bus = ev.EventBus()
    bus.subscribe(resumed.append)
    train(resolve_config(name, "sol_rl", "jpeg_compressibility",
                         sets=[*FAST, f"model.path={folder}", *sets, "run.iterations=2"]),
          bus, resume=True, stop=StopFlag())
    assert [e.iteration for e in resumed if isinstance(e, ev.IterationFinished)] == [2]

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for extra in ([], ["--merge"]):
        result = runner.invoke(app, ["export", "run", "--weights", "trained", *extra])
        assert result.exit_code == 0, result.output
    pipe = WanPipeline.from_pretrained(str(folder))
    pipe.load_lora_weights(str(tmp_path / "run/export/iter_000002-trained"))
    merged = WanTransformer3DModel.from_pretrained(str(tmp_path / "run/export/iter_000002-trained-merged"),
                                                   subfolder="transformer")
    plain = WanTransformer3DModel.from_pretrained(str(folder), subfolder="transformer")
    engine = session.run.engine
    cond = engine.conditioning(["a red circle"])
    x, s = torch.randn(1, *engine.model.latent_shape), torch.tensor([0.7])
    v = lambda net: engine.model.velocity(net, x, s, cond)  # noqa: E731
    with torch.no_grad():
        by_lora, by_merged, untuned = v(pipe.transformer), v(merged), v(plain)
    assert torch.allclose(by_lora, by_merged, atol=1e-5), (by_lora - by_merged).abs().max()
    assert not torch.allclose(by_lora, untuned, atol=1e-6)
    # WanPipeline's own clips: with the LoRA loaded, and with the merged export as its transformer, the same.
    from diffusers import FlowMatchEulerDiscreteScheduler

    kwargs = dict(prompt="a red circle", num_inference_steps=2, guidance_scale=1.0, height=32, width=32, num_frames=5,
                  output_type="pt",
                  latents=torch.randn(1, *engine.model.latent_shape, generator=torch.Generator().manual_seed(5)))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler()
    merged_pipe = WanPipeline.from_pretrained(str(folder), transformer=merged)
    merged_pipe.scheduler = FlowMatchEulerDiscreteScheduler()
    with torch.no_grad():
        lora_clip, merged_clip = pipe(**kwargs).frames, merged_pipe(**kwargs).frames
    assert torch.allclose(lora_clip, merged_clip, atol=1e-4), (lora_clip - merged_clip).abs().max()
    # And its transformer's weights after fuse_lora are the merged export's.
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    fused, exported = pipe.transformer.state_dict(), merged.state_dict()
    assert fused.keys() == exported.keys()
    assert all(torch.allclose(fused[k], exported[k], atol=1e-6) for k in exported)
