"""Settings that follow the official Sol-RL configs (NVlabs/Sana 4b72423 configs/sol_rl/*.py,
train_scripts/sol_rl/): the LoRA init per model, each family's rollout model, the update's one set
of timesteps for its three forwards, and the official explore numerics (per-tensor FP8 E5M2)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.config.schema import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.session import open_session
from solrl_core.loop.stages import explore, regenerate, score_drafts, score_finals, select_seeds
from solrl_core.loop.stages import train as update_on
from solrl_core.plan.resolve import resolve_machine
from solrl_core.precision.e5m2 import E5M2_MAX, fake_quantize_tensor
from solrl_core.precision.hardware import GpuInfo
from solrl_core.precision.quantize import LayerRule, quantize_model

diffusers = pytest.importorskip("diffusers")
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.1)
CUDA = torch.device("cuda", 0)


# --- LoRA init per model ----------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["sana", "flux1", "sd3"])
def test_every_official_model_starts_its_lora_gaussian(model):
    assert resolve_config(model, "sol_rl", "imagereward").model.lora_init == "gaussian"


def _lora_a(init: str, width: int = 256, rank: int = 32) -> torch.Tensor:
    from solrl_core.engine.policy import Policy

    torch.manual_seed(0)
    net = diffusers.SanaTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=width // 64,
                                           attention_head_dim=64, num_layers=1, num_cross_attention_heads=width // 64,
                                           cross_attention_head_dim=64, cross_attention_dim=width, caption_channels=32,
                                           sample_size=8, patch_size=1)
    policy = Policy(net, ModelConfig(lora_init=init, lora_rank=rank, lora_alpha=2 * rank, lora_targets=("attn1.to_q",)))
    return next(p for n, p in net.named_parameters() if "lora_A.default" in n).detach()


def test_lora_init_reaches_peft():
    gaussian, kaiming = _lora_a("gaussian"), _lora_a("kaiming")
    # peft's gaussian: normal with std 1/r; its default: Kaiming-uniform, bound 1/sqrt(in_features).
    assert gaussian.std().item() == pytest.approx(1 / 32, rel=0.05)
    assert kaiming.abs().max().item() <= 1 / math.sqrt(256) + 1e-7
    assert kaiming.std().item() == pytest.approx(1 / math.sqrt(3 * 256), rel=0.05)


def test_an_unknown_lora_init_is_refused():
    with pytest.raises(SolrlError, match="model.lora_init"):
        resolve_config("tiny", "sol_rl", sets=["model.lora_init=pissa"])


# --- each family rolls out on the official model ----------------------------------------------------

@pytest.mark.parametrize("family", ["naive_scaling", "diffusionnft"])
def test_the_official_peft_baselines_roll_out_eagerly_on_the_old_adapter(family):
    cfg = resolve_config("sana", family, "imagereward")
    plan = resolve_machine(cfg, CUDA, "bf16", gpu=H100)
    assert not plan.rollout_copy and not plan.rollout_compile and not plan.policy_rollout_compile
    assert "as configured" in plan.rollout_copy_why


@pytest.mark.parametrize("family", ["compile", "sol_rl", "naive_quant"])
def test_the_compiled_families_roll_out_on_a_merged_compiled_copy(family):
    plan = resolve_machine(resolve_config("sana", family, "imagereward"), CUDA, "bf16", gpu=H100)
    assert plan.rollout_copy and plan.rollout_compile


def test_naive_scaling_can_still_be_compiled():
    cfg = resolve_config("sana", "naive_scaling", "imagereward",
                         sets=["sampler.rollout_copy=auto", "sampler.compile=auto"])
    plan = resolve_machine(cfg, CUDA, "bf16", gpu=H100)
    assert plan.rollout_copy and plan.rollout_compile


def test_presets_say_which_family_is_compiled():
    from solrl_core.config.presets import get_preset

    assert "eager" in get_preset("families", "naive_scaling").description
    assert "compile" in get_preset("families", "compile").description


# --- the update's three forwards see the same timesteps ---------------------------------------------

def test_old_trained_and_reference_forwards_get_identical_inputs(fast_sets):
    cfg = resolve_config("tiny", "sol_rl",
                         sets=fast_sets("run.eval_prompts=", "run.dtype=bf16", "sampler.rollout_copy=true"))
    run = open_session(cfg).run
    assert run.engine.rollout_copy is not None and cfg.algorithm.kl_beta != 0
    rng = np.random.default_rng(0)
    drafts = explore(run, run.prompts[:2], rng)
    kept = drafts.subset(select_seeds(run, score_drafts(run, LoopState(), ev.EventBus(), drafts), rng))
    batch = score_finals(run, LoopState(), ev.EventBus(), regenerate(run, kept))
    calls: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"old": [], "reference": [], "trained": []}

    def record(kind, module, args, kwargs):  # type: ignore[no-untyped-def]
        kind = kind if kind == "old" else "trained" if torch.is_grad_enabled() else "reference"
        calls[kind].append((kwargs["timestep"].detach().clone(), kwargs["hidden_states"].detach().clone()))

    copy, policy = run.engine.rollout_copy.module, run.engine.policy.transformer
    hooks = [copy.register_forward_pre_hook(functools.partial(record, "old"), with_kwargs=True),
             policy.register_forward_pre_hook(functools.partial(record, "policy"), with_kwargs=True)]
    try:
        update_on(run, batch, rng)
    finally:
        for h in hooks:
            h.remove()
    # one old (copy), one reference and one trained forward per micro-batch; on a CPU the micro-batches
    # run in lanes (runtime/lanes.py), so each trained forward is matched to its two by content
    assert calls["trained"] and len(calls["old"]) == len(calls["reference"]) == len(calls["trained"])
    for t, x in calls["trained"]:
        assert t.dtype == torch.float32 and x.dtype == torch.bfloat16
        for kind in ("old", "reference"):
            assert any(torch.equal(t, t2) and torch.equal(x, x2) for t2, x2 in calls[kind]), kind


def test_sana_and_sd3_wrappers_pass_fp32_timesteps_to_the_transformer():
    from solrl_core.models.base import Conditioning, sana_velocity
    from solrl_core.models.sd3 import sd3_velocity

    seen = []

    def fake(**kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["timestep"])
        return (kwargs["hidden_states"],)

    sigma = torch.tensor([0.6013])
    latents = torch.zeros(1, 4, 2, 2, dtype=torch.bfloat16)
    cond = Conditioning(embeds=torch.zeros(1, 3, 8), mask=torch.ones(1, 3), pooled=torch.zeros(1, 8))
    sana_velocity(fake, latents, sigma, cond)
    sd3_velocity(fake, latents, sigma, cond)
    for t in seen:
        assert t.dtype == torch.float32 and t.item() == pytest.approx(601.3, abs=1e-3)


# --- the official explore numerics: per-tensor FP8 E5M2 ---------------------------------------------

def test_e5m2_keeps_two_mantissa_bits_at_the_tensors_scale():
    x = torch.tensor([1.0, 0.3, -0.7, 0.0, 1e-3])
    q = fake_quantize_tensor(x)
    scale = E5M2_MAX / 1.0
    assert torch.equal(q, (x * scale).to(torch.float8_e5m2).float() / scale)
    assert q[0] == 1.0 and q[3] == 0.0
    assert q[1].item() == pytest.approx(2**14 / E5M2_MAX)  # 0.3 x 57344 = 17203 -> 2^14 on a 2-bit mantissa
    assert torch.equal(fake_quantize_tensor(torch.zeros(3)), torch.zeros(3))
    assert fake_quantize_tensor(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_e5m2_explore_copy_swaps_the_rules_layers_and_stays_close():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    x = torch.randn(8, 64)
    want = net(x)
    report = quantize_model(net, LayerRule(), "fp8-e5m2-tensor")
    assert len(report.quantized) == 2 and report.precision == "fp8-e5m2-tensor"
    got = net(x)
    err = ((got - want).norm() / want.norm()).item()
    assert 0 < err < 0.15  # 2 mantissa bits: a few percent, never exact


def test_e5m2_explore_precision_trains_the_tiny_model(fast_sets):
    from solrl_core.loop.trainer import StopFlag, train

    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=1", "run.eval_prompts=",
                                                          "explore.precision=fp8-e5m2-tensor"))
    session = train(cfg, ev.EventBus(), stop=StopFlag())
    assert session.run.plan.explore_precision == "fp8-e5m2-tensor"
    assert session.run.engine.explore_copy.report.precision == "fp8-e5m2-tensor"


# --- training precision per model -------------------------------------------------------------------

def test_presets_carry_each_official_training_regime():
    assert resolve_config("sana", "sol_rl", "imagereward").model.train_precision == "bf16"
    assert resolve_config("sd3", "sol_rl", "imagereward").model.train_precision == "fp32-base"
    assert resolve_config("flux1", "sol_rl", "imagereward").model.train_precision == "autocast"


def test_fp32_base_doubles_the_policy_in_the_estimate():
    from solrl_core.plan.footprint import estimate_memory

    bf16 = estimate_memory(resolve_config("sd3", "sol_rl", "imagereward", sets=["model.train_precision=autocast"]),
                           "fp8", "bf16")
    fp32 = estimate_memory(resolve_config("sd3", "sol_rl", "imagereward"), "fp8", "bf16")
    assert fp32.policy == pytest.approx(2 * bf16.policy) and fp32.explore_copy == bf16.explore_copy


@pytest.mark.parametrize("regime, base, autocast_on", [("autocast", torch.bfloat16, True), ("bf16", torch.bfloat16,
                                                                                            False),
                                                        ("fp32-base", torch.float32, True)])
def test_each_training_regime_runs_its_forwards_as_named(fast_sets, monkeypatch, regime, base, autocast_on):
    from solrl_core.loop.trainer import StopFlag, train

    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=1", "run.eval_prompts=", "run.dtype=bf16",
                                                          "sampler.rollout_copy=false",
                                                          f"model.train_precision={regime}"))
    seen: list[tuple[bool, torch.dtype]] = []

    def record(module, args, kwargs):  # type: ignore[no-untyped-def]
        if torch.is_grad_enabled():  # the trained forward
            seen.append((torch.is_autocast_enabled("cpu"), kwargs["hidden_states"].dtype))

    import solrl_core.loop.session as session_module

    opened = session_module.open_session

    def hooked(*a, **k):  # type: ignore[no-untyped-def]
        s = opened(*a, **k)
        s.run.engine.policy.transformer.register_forward_pre_hook(record, with_kwargs=True)
        return s

    import solrl_core.loop.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "open_session", hooked)
    session = train(cfg, ev.EventBus(), stop=StopFlag())
    base_dtypes = {p.dtype for n, p in session.run.engine.policy.transformer.named_parameters() if "lora_" not in n}
    assert base_dtypes == {base}
    assert seen and {a for a, _ in seen} == {autocast_on} and {d for _, d in seen} == {torch.bfloat16}
    assert next(session.run.engine.explore_copy.module.parameters()).dtype == torch.bfloat16


# --- every setting of the three paper models against the official table ----------------------------
# docs/official-settings.md says where each official value comes from (NVlabs/Sana configs/sol_rl/*.py,
# train_scripts/sol_rl/train_*.py). The values are written here by hand, not read from the presets.

OFFICIAL_COMMON = {
    "run.prompts_per_iteration": 48, "explore.group_size": 96, "selection.group_size": 24,
                   "selection.mode": "best_worst",
    "explore.steps": 6, "sampler.steps": 10, "sampler.rollout_batch": 24, "sampler.guidance": 1.0,
    "model.lora_rank": 32, "model.lora_alpha": 64, "model.lora_init": "gaussian",
    "optimizer.lr": 3e-4, "optimizer.beta1": 0.9, "optimizer.beta2": 0.999, "optimizer.weight_decay": 1e-4,
    "optimizer.eps": 1e-8, "algorithm.nft_beta": 1.0, "algorithm.kl_beta": 1e-4, "algorithm.adv_clip_max": 5.0,
    "algorithm.old_decay_rate": 0.001, "algorithm.old_decay_max": 0.5, "algorithm.ema_max_decay": 0.9,
    "run.prompts": "pickscore_train", "run.eval_prompts": "pickscore_test", "run.eval_every": 20, "run.eval_seeds": 1,
    "run.tf32": True, "run.compile_mode": "max-autotune-no-cudagraphs", "run.checkpoint_every": 5, "run.seed": 42,
    "run.min_trade": 0.0,  # no early stop on the trade: the official code trains every iteration it is given
}
OFFICIAL = {
    "sana": {"model.resolution": 1024, "sampler.eval_steps": 40, "sampler.solver": "euler", "sampler.shift": 1.0,
             "sampler.euler_step": "fp32",  # run_sampling: flow_grpo_step(pred.float(), z.float()), then z.to(dtype)
             "algorithm.timestep_fraction": 0.6, "optimizer.grad_clip": 1.0, "optimizer.micro_batch": 16,
             "model.train_precision": "bf16", "model.quant_min_dim": 2240, "model.prompt_instruction": False,
             # attn.qkv, attn.proj, cross_attn.q_linear/kv_linear/proj, as diffusers splits them
             "model.lora_targets": ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                                    "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0")},
    "sd3": {"model.resolution": 1024, "sampler.eval_steps": 40, "sampler.solver": "dpm2",
            "sampler.sigma_grid": "scheduler",
            "algorithm.timestep_fraction": 0.6, "optimizer.grad_clip": 0.002, "optimizer.micro_batch": 4,
            "model.train_precision": "fp32-base", "model.quant_min_dim": 2432, "model.max_sequence_length": 128,
            "model.lora_targets": ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj",
                                   "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out")},
    "flux1": {"model.resolution": 512, "sampler.eval_steps": 28, "sampler.solver": "dpm2",
              "algorithm.timestep_fraction": 0.4,
              "optimizer.grad_clip": 1.0, "optimizer.micro_batch": 12, "model.train_precision": "autocast",
              "model.quant_min_dim": 1000, "model.max_sequence_length": 128,
              "model.lora_targets": ("to_q", "to_k", "to_v", "to_out.0")},
}


def _get(cfg, key: str):  # type: ignore[no-untyped-def]
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


@pytest.mark.parametrize("model", sorted(OFFICIAL))
def test_each_paper_preset_carries_the_official_settings(model):
    cfg = resolve_config(model, "sol_rl", "pickscore")
    want = {**OFFICIAL_COMMON, **OFFICIAL[model]}
    got = {key: _get(cfg, key) for key in want}
    assert {k: v for k, v in got.items() if v != want[k]} == {}


@pytest.mark.parametrize("family, n", [("sol_rl", 96), ("naive_scaling", 96), ("diffusionnft", 24)])
def test_each_family_keeps_the_official_group_sizes(family, n):
    cfg = resolve_config("sana", family, "pickscore")
    assert (cfg.explore.group_size if family != "diffusionnft" else cfg.selection.group_size) == n
    assert cfg.selection.group_size == 24


# --- prompts and evaluation of the real-model presets, resolved offline ------------------------------

REAL = ("sana", "sd3", "flux1", "sana15", "sana_600m", "sd35_medium", "flux2_klein", "qwen_image", "zimage",
        "wan21_t2v_1_3b", "wan21_t2v_14b", "wan22_ti2v_5b")


@pytest.mark.parametrize("model", REAL)
def test_real_presets_name_the_pickscore_sets_without_downloading(model, monkeypatch, tmp_path):
    import urllib.request

    from solrl_core.data.prompt_sets import cached_path, download_sets

    def no_network(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("resolving a preset must not download")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = resolve_config(model, "sol_rl", "pickscore")
    sets = download_sets()
    assert (cfg.run.prompts, cfg.run.eval_prompts, cfg.run.eval_every) == ("pickscore_train", "pickscore_test", 20)
    assert cfg.run.prompts in sets and cfg.run.eval_prompts in sets
    assert not cached_path(sets["pickscore_train"]).exists()
    assert (cfg.run.seed, cfg.run.checkpoint_every, cfg.run.eval_seeds) == (42, 5, 1)


def test_the_general_set_stays_a_flag_away(monkeypatch):
    from solrl_core.data.prompts import load_prompts

    cfg = resolve_config("sana", "sol_rl", "pickscore", sets=["run.prompts=general", "run.eval_prompts=general"])
    assert cfg.run.prompts == "general" and len(load_prompts(cfg.run.prompts)) == 24


def test_without_network_a_download_set_fails_with_the_quick_look_fix(monkeypatch, tmp_path):
    import urllib.error
    import urllib.request

    from solrl_core.data.prompts import load_prompts

    def unreachable(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", unreachable)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(SolrlError) as err:
        load_prompts("pickscore_train")
    assert "cannot download prompt set pickscore_train" in err.value.message and "\n" not in err.value.message
    assert "--prompts general" in err.value.fix and "--prompts FILE.txt" in err.value.fix


def test_a_download_shows_progress_and_is_cached(monkeypatch, tmp_path):
    import io
    import urllib.request

    from solrl_core.data import prompt_sets
    from solrl_core.data.prompt_sets import DownloadSet, fetch_download, git_blob_id

    body = b"a cat on a mat\n" * 10_000
    calls: list[int] = []

    class Answer(io.BytesIO):
        headers = {"Content-Length": str(len(body))}

        def __exit__(self, *exc):  # type: ignore[no-untyped-def]
            calls.append(1)
            return super().__exit__(*exc)

    updates: list[int] = []

    class Bar:
        def __init__(self, total, desc):  # type: ignore[no-untyped-def]
            assert total == len(body) and "prompt set small" in desc

        def __enter__(self):  # type: ignore[no-untyped-def]
            return self

        def __exit__(self, *exc):  # type: ignore[no-untyped-def]
            return False

        def update(self, n: int) -> None:
            updates.append(n)

    monkeypatch.setattr(prompt_sets, "progress_bar", Bar)
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: Answer(body))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    entry = DownloadSet("small", "https://example.invalid/small.txt", git_blob_id(body), "test", "here")
    path = fetch_download(entry, offline=False)
    assert path.read_bytes() == body and calls == [1]
    assert sum(updates) == len(body) and len(updates) > 1, updates
    assert fetch_download(entry, offline=True) == path and calls == [1]  # the second read is the cache's
    assert prompt_sets.cached_path(entry) == path


def test_dump_config_shows_the_official_run_settings():
    from typer.testing import CliRunner

    from solrl_cli.app import app

    for model in ("sana", "sd3", "flux1"):
        result = CliRunner().invoke(app, ["train", "--model", model, "--dump-config"])
        assert result.exit_code == 0, result.output
        for line in ('prompts = "pickscore_train"', 'eval_prompts = "pickscore_test"', "eval_every = 20", "tf32 = true",
                     'compile_mode = "max-autotune-no-cudagraphs"', "checkpoint_every = 5", "seed = 42"):
            assert line in result.output.splitlines(), (model, line)


# --- TF32 --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("enabled, matmul", [(True, "high"), (False, "highest")])
def test_tf32_reaches_torch_on_cuda_and_nothing_on_a_cpu(monkeypatch, enabled, matmul):
    import solrl_core.runtime.device as device_module
    from solrl_core.engine.engine import resolve_runtime

    seen: list[str] = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", seen.append)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", not enabled)  # restored after the test
    cfg = resolve_config("tiny", "sol_rl", sets=[f"run.tf32={str(enabled).lower()}", "run.device=cpu"])
    assert resolve_runtime(cfg)[0].type == "cpu" and seen == []  # a CPU: nothing set
    monkeypatch.setattr(device_module, "resolve_device", lambda name: CUDA)  # the CUDA path, on this CPU
    device, _, _ = resolve_runtime(cfg)
    assert device == CUDA and seen == [matmul] and torch.backends.cudnn.allow_tf32 is enabled


def test_the_start_up_line_names_tf32_on_cuda_only():
    cfg = resolve_config("sana", "sol_rl", "imagereward")
    assert "TF32 on" in resolve_machine(cfg, CUDA, "bf16", gpu=H100).describe()
    off = resolve_config("sana", "sol_rl", "imagereward", sets=["run.tf32=false"])
    assert "TF32 off" in resolve_machine(off, CUDA, "bf16", gpu=H100).describe()
    assert "TF32" not in resolve_machine(cfg, torch.device("cpu"), "fp32").describe()


def test_tf32_settings_leave_the_legacy_and_generic_getters_readable():
    """Inductor's max-autotune reads torch.get_float32_matmul_precision(), which raises after a mix of
    torch's legacy and per-backend TF32 APIs: the settings solrl applies keep both readable."""
    from solrl_core.runtime.tf32 import tf32_settings

    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    try:
        for enabled in (True, False):
            s = tf32_settings(enabled, CUDA)
            torch.set_float32_matmul_precision(s["float32_matmul_precision"])
            torch.backends.cudnn.allow_tf32 = s["cudnn.allow_tf32"]
            assert torch.get_float32_matmul_precision() == s["float32_matmul_precision"]
            assert torch.backends.cuda.matmul.allow_tf32 is enabled and torch.backends.cudnn.allow_tf32 is enabled
        assert tf32_settings(True, torch.device("cpu")) == {}
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
