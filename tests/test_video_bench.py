"""What `solrl bench` and the doctor know of the video models. FLOPs per denoising step:
`wan_forward_flops` (bench/video.py) derives a Wan forward from its config and latent (latent frames x
tokens per frame), checked against torch's FlopCounterMode on the published Wan 2.1 1.3B, 14B and
Wan 2.2 TI2V 5B transformers (meta device, no memory) at their presets' sizes and at more frames, and
against the count a Wan training run makes of itself (telemetry/model_flops.py) on a tiny random
WanPipeline. The doctor: the weights to download, the memory estimate and the strategy per GPU size."""

from __future__ import annotations

import pytest
import torch

from solrl_core.bench.video import VIDEO_REAL, VIDEO_VAE_FACTOR, WAN_TOKENS, wan_forward_flops
from solrl_core.models.wan import latent_frames
from solrl_core.presets import resolve_config

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
    assert wan_forward_flops(published(name), latent, time_per_token=per_token) == counted(published(name), latent, per_token)


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
    from tests.test_wan import FAST, NAME
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


def test_bench_names_a_video_models_derived_step_flops_where_it_does_not_time_it():
    from solrl_core.bench.build import bench_model
    from solrl_core.errors import SolrlError

    with pytest.raises(SolrlError) as err:
        bench_model("wan21_t2v_1_3b", "wan", 256, "real")
    flops = wan_forward_flops(VIDEO_REAL["wan21_t2v_1_3b"], (16, 2, 32, 32))
    assert f"at 256 px, 5 frames: {flops / 1e12:.2f} TFLOP, derived" in err.value.message and "\n" not in str(err.value)


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
    assert online.status == "warn" and f"{hub}: not in the Hugging Face cache; will download on first use (~{gb} GB" in online.detail
    assert download == gb and "--model-path" in online.fix
    offline, _ = _model_weights(cfg, Machine([], None, True, tmp_path))
    assert offline.status == "fail" and f"download {hub} once" in offline.fix
    h100, small = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.1), GpuInfo(0, "NVIDIA L4", (8, 9), 22.0)
    label = cfg.model.hub_id and doc._memory(cfg, h100, "auto").detail
    assert "Wan" in label and "estimate" in label
    # The 1.3B fits one 24 GB-class GPU; the 14B (its explore copy lean) one H100 but no L4 even
    # sharded over 8, the 5B a larger GPU than an L4.
    fits = {gpu.name: strategy_check(cfg, gpu, 1) for gpu in (h100, small)}
    expected = {"wan21_t2v_1_3b": ("pass", "pass"), "wan21_t2v_14b": ("pass", "warn"), "wan22_ti2v_5b": ("pass", "warn")}[name]
    assert (fits[h100.name].status, fits[small.name].status) == expected
    if name == "wan21_t2v_14b":
        assert "fsdp over 8" in fits[small.name].detail and "no strategy fits" in fits[small.name].fix
