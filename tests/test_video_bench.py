"""What `solrl bench` and the doctor know of the video models. FLOPs per denoising step:
`wan_forward_flops` (bench/video.py) derives a Wan forward from its config and latent (latent frames x
tokens per frame), checked against torch's FlopCounterMode on the published Wan 2.1 1.3B, 14B and
Wan 2.2 TI2V 5B transformers (meta device, no memory) at their presets' sizes and at more frames, and
against the count a Wan training run makes of itself (telemetry/model_flops.py) on a tiny random
WanPipeline. The bench's Wan pipelines: the real latent at the bench's pixel size, saved and loaded
back through `solrl train`'s Wan loader, timed end to end at tiny size, the memory check and the
refusals. The doctor: the weights to download, the memory estimate and the strategy per GPU size.
No test checks a timing."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core.bench.build import bench_model, build_pipeline
from solrl_core.bench.flops import count_sample_flops, forward_inputs, text_tokens, wan_latent
from solrl_core.bench.video import VIDEO_REAL, VIDEO_VAE_FACTOR, WAN_TOKENS, wan_forward_flops
from solrl_core.config.presets import resolve_config
from solrl_core.models.wan import latent_frames

SPATIAL = VIDEO_VAE_FACTOR


def published(name: str) -> dict:
    return VIDEO_REAL[name]


def counted(config: dict, latent: tuple[int, int, int, int], per_token: bool) -> int:
    import diffusers
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        net = diffusers.WanTransformer3DModel(**config).to(torch.bfloat16).eval()
        x = torch.randn(1, *latent, dtype=torch.bfloat16)
        tokens = latent[1] * latent[2] * latent[3] // 4
        t = torch.full((1, tokens) if per_token else (1,), 500.0)
        text = torch.randn(1, WAN_TOKENS, 4096, dtype=torch.bfloat16)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            net(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", list(VIDEO_REAL))
def test_the_derivation_equals_the_counter_on_the_published_wan_models(name):
    cfg = resolve_config(name, "sol_rl").model
    side = cfg.resolution // SPATIAL[name]
    per_token = name == "wan22_ti2v_5b"  # expand_timesteps: a timestep per latent token
    latent = (VIDEO_REAL[name]["in_channels"], latent_frames(cfg.frames, 4), side, side)
    assert wan_forward_flops(published(name), latent, time_per_token=per_token) == counted(published(name), latent,
                                                                                           per_token)


def test_a_longer_clip_costs_about_its_latent_frames_more():
    name = "wan21_t2v_1_3b"
    short, long = ((16, latent_frames(frames, 4), 32, 32) for frames in (5, 17))  # 2 and 5 latent frames of 32x32
    assert wan_forward_flops(published(name), long) == counted(published(name), long, False)
    ratio = wan_forward_flops(published(name), long) / wan_forward_flops(published(name), short)
    # 2.5x the latent tokens: the linear layers 2.5x, self-attention 6.25x, the text embedding not at all
    assert 2.4 < ratio < 2.6  # 2.47 here


def test_a_wan_runs_own_count_is_the_derivation_at_its_latent(tmp_path):
    from solrl_core.models import load_model
    from solrl_core.telemetry.model_flops import count_velocity_flops
    from tests.helpers import WAN_FAST as FAST, WAN_NAME as NAME
    from tests.tiny_pipelines import save_tiny_pipeline

    folder = save_tiny_pipeline(NAME, tmp_path / NAME)
    forward = {}
    for frames in (5, 9):
        cfg = resolve_config(NAME, "sol_rl", sets=[*FAST, f"model.path={folder}", f"model.frames={frames}"])
        model = load_model(cfg.model, torch.device("cpu"), torch.float32)
        flops = count_velocity_flops(model, model.encode(["a red circle"]), torch.float32)
        config = dict(model.transformer.config)
        assert flops.forward == wan_forward_flops(config, model.latent_shape), frames
        assert flops.forward_backward > flops.forward  # the backward through the blocks counts too
        forward[frames] = flops.forward
    assert forward[9] > forward[5]  # 3 latent frames against 2 (the tiny model: mostly its 512 text tokens)


runner = CliRunner()
PRESET_LATENTS = {"wan21_t2v_1_3b": (16, 2, 32, 32), "wan21_t2v_14b": (16, 2, 32, 32), "wan22_ti2v_5b": (48, 2, 30, 30)}


@pytest.mark.parametrize("name", list(VIDEO_REAL))
def test_the_bench_builds_the_real_latent_at_a_reduced_pixel_size(name):
    """The bench's small Wan VAE compresses 4x (Wan 2.2: 8x) where the released one compresses 8x (16x):
    the preset's clip (5 frames at 256 px; 480 px) gives the same latent at a quarter (a half) the side."""
    cfg = resolve_config(name, "sol_rl").model
    model = bench_model(name, cfg.loader, cfg.resolution, "real", frames=cfg.frames)
    assert model.transformer == VIDEO_REAL[name]
    assert model.resolution == {"wan22_ti2v_5b": 240}.get(name, 128) and model.resolution < cfg.resolution
    assert wan_latent(model) == PRESET_LATENTS[name]
    assert wan_latent(model)[2:] == (cfg.resolution // VIDEO_VAE_FACTOR[name],) * 2  # the released VAE's latent


def test_the_bench_counts_a_wan_forward_by_the_derivation_and_its_training_pass_on_the_meta_device():
    name = "wan21_t2v_1_3b"
    model = bench_model(name, "wan", 256, "real", frames=5)
    flops = count_sample_flops(model, text_tokens("wan", 0))
    assert flops.forward == wan_forward_flops(VIDEO_REAL[name], PRESET_LATENTS[name]) == counted(VIDEO_REAL[name],
            PRESET_LATENTS[name], False)
    assert 1.5 * flops.forward < flops.forward_backward < 3 * flops.forward  # activation gradients only: frozen base


@pytest.mark.parametrize("name, latent", [("wan21_t2v_1_3b", (16, 2, 8, 8)), ("wan22_ti2v_5b", (48, 2, 8, 8))])
def test_the_bench_pipeline_loads_back_through_the_wan_loader_with_the_shapes_it_counts(name, latent, tmp_path):
    """Saved in the hub's WanPipeline layout and loaded by `solrl train`'s own loader: the latent and the
    transformer's inputs are the ones the FLOP count is made on, and a clip decodes to the preset's frames."""
    from solrl_core.models import load_model

    cfg = resolve_config(name, "sol_rl")
    model = bench_model(name, cfg.model.loader, cfg.model.resolution, "tiny", frames=cfg.model.frames)
    build_pipeline(model, tmp_path / "pipe")
    index = json.loads((tmp_path / "pipe" / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline" and index.get("expand_timesteps", False) == (name == "wan22_ti2v_5b")
    cfg = resolve_config(name, "sol_rl",
                         sets=[f"model.path={tmp_path / 'pipe'}", f"model.resolution={model.resolution}"])
    loaded = load_model(cfg.model, torch.device("cpu"), torch.float32)
    assert loaded.latent_shape == latent == wan_latent(model)
    assert loaded.vae.config.z_dim == latent[0] and loaded.transformer.config.text_dim == model.transformer["text_dim"]
    seen = {}
    loaded.transformer.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs), with_kwargs=True)
    cond = loaded.encode(["a red circle"])
    with torch.no_grad():
        loaded.velocity(loaded.transformer, torch.zeros(1, *loaded.latent_shape), torch.full((1,), 0.5), cond)
        clips = loaded.decode(torch.zeros(1, *loaded.latent_shape))
    expected = forward_inputs(model, text_tokens("wan", cfg.model.max_sequence_length), 1, "cpu")
    shapes = {k: tuple(v.shape) for k, v in seen.items() if torch.is_tensor(v)}
    assert shapes == {k: tuple(v.shape) for k, v in expected.items() if torch.is_tensor(v)}
    assert tuple(clips.shape) == (1, cfg.model.frames, 3, model.resolution, model.resolution)


def test_bench_times_a_wan_model_at_tiny_size_and_prints_the_table(tmp_path):
    """End to end on the CPU: build, train one measured sol_rl iteration through `solrl train`, print."""
    from solrl_core.telemetry.model_flops import SampleFlops, phase_flops

    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "--model", "wan21_t2v_1_3b", "--size", "tiny", "--device", "cpu", "--family",
                                 "sol_rl",
                                 "--n", "4", "--k", "2", "--rollout-batch", "4", "--iterations", "2", "--json",
                                 str(out)])
    assert result.exit_code == 0, result.output
    for text in ("building the wan21_t2v_1_3b transformer at tiny size", "one-layer UMT5 text encoder", "small Wan VAE",
                 "wan_forward_flops", "iteration 2/2", "seconds per iteration", "clips/s", "model FLOPs utilisation"):
        assert text in result.output, text
    data = json.loads(out.read_text())
    m, (row,) = data["model"], data["rows"]
    assert (m["loader"], m["frames"], m["latent_side"], m["resolution"], m["vae"]) == ("wan", 5, 8, 32, "small Wan")
    assert m["flops_per_sample"]["forward"] == wan_forward_flops(m["transformer_config"], (16, 2, 8, 8))
    from solrl_core.plan.plan import plan_stages

    run = resolve_config("wan21_t2v_1_3b", "sol_rl", sets=["explore.group_size=4", "selection.group_size=2"])
    expected = phase_flops(plan_stages(run, "fp32", "nvfp4-emulated"), run, SampleFlops(**m["flops_per_sample"]), 1)
    assert row["flops"] == expected and row["iterations_measured"] == 1
    assert row["seconds"]["explore"] > 0 and row["seconds"]["regenerate"] > 0 and row["seconds"]["train"] > 0


def test_the_wan_refusals_are_one_line_with_the_fix():
    result = runner.invoke(app, ["bench", "--model", "wan21_t2v_1_3b", "--size", "tiny", "--device", "cpu",
                                 "--real-vae"])
    assert result.exit_code == 2 and "none is recorded for the wan21_t2v_1_3b preset's wan loader" in result.output
    assert "leave --real-vae out" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["bench", "--model", "wan21_t2v_14b", "--device", "cpu"])
    assert result.exit_code == 2 and "--size tiny --device cpu" in result.output and "Traceback" not in result.output


def test_a_real_size_wan_bench_is_checked_against_the_gpu_before_building(monkeypatch):
    from solrl_core.bench import run as bench_run
    from solrl_core.plan import resolve
    from solrl_core.precision.hardware import GpuInfo
    from solrl_core.runtime import device as device_mod

    monkeypatch.setattr(device_mod, "resolve_device", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(resolve, "gpu_of", lambda device: GpuInfo(0, "made-up", (9, 0), 24.0))
    monkeypatch.setattr(bench_run, "_build", lambda *a, **k: pytest.fail("built although the estimate does not fit"))
    result = runner.invoke(app, ["bench", "--model", "wan21_t2v_14b", "--family", "sol_rl"])
    assert result.exit_code == 2, result.output
    assert "sol_rl does not fit on cuda:0 made-up" in result.output and "more memory" in result.output


@pytest.mark.parametrize("name, hub, gb", [("wan21_t2v_1_3b", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", 29),
                                           ("wan21_t2v_14b", "Wan-AI/Wan2.1-T2V-14B-Diffusers", 80),
                                           ("wan22_ti2v_5b", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", 34)])
def test_the_doctor_names_the_wan_weights_to_download_and_what_fits_per_gpu(name, hub, gb, tmp_path):
    import solrl_core.doctor as doc
    from solrl_core.doctor.check import Machine
    from solrl_core.doctor.strategy import strategy_check
    from solrl_core.doctor.weights import _model_weights
    from solrl_core.precision.hardware import GpuInfo

    cfg = resolve_config(name, "sol_rl")
    online, download = _model_weights(cfg, Machine([], None, False, tmp_path))  # an empty cache
    assert (online.status == "warn"
            and f"{hub}: not in the Hugging Face cache; will download on first use (~{gb} GB" in online.detail)
    assert download == gb and "--model-path" in online.fix
    offline, _ = _model_weights(cfg, Machine([], None, True, tmp_path))
    assert offline.status == "fail" and f"download {hub} once" in offline.fix
    h100, small = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.1), GpuInfo(0, "NVIDIA L4", (8, 9), 22.0)
    label = cfg.model.hub_id and doc._memory(cfg, h100, "auto").detail
    assert "Wan" in label and "estimate" in label
    # The 1.3B fits one 24 GB-class GPU; the 14B (its explore copy lean) one H100 but no L4 even
    # sharded over 8, the 5B a larger GPU than an L4.
    fits = {gpu.name: strategy_check(cfg, gpu, 1) for gpu in (h100, small)}
    expected = {"wan21_t2v_1_3b": ("pass", "pass"), "wan21_t2v_14b": ("pass", "warn"),
                "wan22_ti2v_5b": ("pass", "warn")}[name]
    assert (fits[h100.name].status, fits[small.name].status) == expected
    if name == "wan21_t2v_14b":
        assert "fsdp over 8" in fits[small.name].detail and "no strategy fits" in fits[small.name].fix


@pytest.mark.parametrize("name, width", [("wan21_t2v_1_3b", 1536), ("wan21_t2v_14b", 5120), ("wan22_ti2v_5b", 3072)])
def test_explore_scales_a_wan_presets_layer_rule_to_the_tiny_width(name, width):
    """`solrl bench --explore` at tiny size quantizes the layers the preset's rule would at real width."""
    from solrl_core.bench.explore import layer_rule
    from solrl_core.bench.video import wan_transformer_config

    cfg = resolve_config(name, "sol_rl")
    assert layer_rule(cfg, wan_transformer_config(name, "real"), "real").min_dim == cfg.model.quant_min_dim
    assert layer_rule(cfg, wan_transformer_config(name, "tiny"),
                      "tiny").min_dim == round(cfg.model.quant_min_dim * 32 / width)
