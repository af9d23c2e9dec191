"""The real-model loaders (SANA, FLUX.1, SD3, SD3.5-Medium) on tiny random pipelines of the real architectures,
saved in the hub's diffusers layout: parity with diffusers' own pipelines, one training iteration,
LoRA targets, and the errors for broken folders and missing hub weights. Offline, CPU, seconds."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from peft.tuners.tuners_utils import BaseTunerLayer

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine.policy import Policy
from solrl_core.engine.sampler import noise_for_seeds, sample, sigma_grid
from solrl_core.errors import SolrlError
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.models import load_model
from solrl_core.models.base import Conditioning
from solrl_core.models.diffusers_models import select_files, weight_choice
from tests.tiny_pipelines import BUILDERS, save_tiny_pipeline
from tests.helpers import diffusers_pipeline as _pipeline, REAL_FAST as FAST

# Model presets, each with a tiny pipeline of its architecture in tests/tiny_pipelines.py.
LOADERS = ("sana", "flux1", "sd3", "sd35_medium", "qwen_image", "zimage", "flux2_klein")
CPU = torch.device("cpu")
PACKED = ("flux1", "qwen_image")  # pipelines that take and return 2x2-packed latent tokens
# At 32px: the tiny Qwen-Image VAE downsamples 4x, the others 2x; FLUX.2's latents are 2x2 patches.
LATENT_SIDE = {"qwen_image": 8, "flux2_klein": 8}


def _marked(slow: tuple[str, ...]) -> list:  # type: ignore[type-arg]
    """LOADERS as parameters, those in `slow` (over ten seconds on a 2-core CPU) marked slow."""
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name for name in LOADERS]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One saved tiny pipeline per loader, shared read-only by the tests of this module."""
    root = tmp_path_factory.mktemp("pipelines")
    return {name: save_tiny_pipeline(name, root / name) for name in LOADERS}


def _model_config(name: str, folder, *extra: str):  # type: ignore[no-untyped-def]
    return resolve_config(name, "sol_rl", "jpeg_compressibility", sets=[*FAST, f"model.path={folder}", *extra]).model


@pytest.mark.parametrize("name", _marked(("zimage", "flux2_klein")))
def test_rollout_matches_the_diffusers_pipeline(name, folders):
    # Same prompt, same noise, same sigmas: our encode + velocity + Euler sampler + decode must give
    # the pipeline's own latents and images. This pins each model's timestep scale (SANA and SD3
    # sigma * 1000, FLUX sigma), FLUX's packing, ids and guidance, and the VAE shift/scale.
    torch.manual_seed(0)
    model = load_model(_model_config(name, folders[name]), CPU, torch.float32)
    prompts = ["a red circle", "two blue squares"]
    cond = model.encode(prompts)
    noise = noise_for_seeds([3, 4], model.latent_shape, CPU)
    sigmas = sigma_grid(2)
    ours = sample(lambda x, s, c: model.velocity(model.transformer, x, s, c), noise, cond, sigmas)
    pipe = _pipeline(name, folders[name])
    kwargs = dict(prompt=prompts, num_inference_steps=2, sigmas=sigmas[:-1].tolist(), guidance_scale=1.0, height=32,
                  width=32)
    if name == "zimage":  # the Turbo model samples without CFG
        kwargs.update(guidance_scale=0.0)
    if name == "sana":  # solrl encodes as the official code does: no complex human instruction
        kwargs.update(use_resolution_binning=False, complex_human_instruction=None)
    if _model_config(name, folders[name]).max_sequence_length:  # the official T5 length (flux1, sd3 presets)
        kwargs.update(max_sequence_length=_model_config(name, folders[name]).max_sequence_length)
    latents = noise
    if name in PACKED:
        from solrl_core.models.flux import pack

        latents = pack(noise)
    # A fresh prompt list per call: ZImagePipeline's encode_prompt rewrites the list it is given.
    theirs = pipe(latents=latents, output_type="latent", **{**kwargs, "prompt": list(prompts)})[0]
    if name in PACKED:
        from solrl_core.models.flux import unpack

        theirs = unpack(theirs, *model.latent_shape[1:])
    if name == "flux2_klein":  # the pipeline returns the VAE latent: un-normalised, un-patched
        from diffusers import Flux2KleinPipeline

        bn = pipe.vae.bn
        std = torch.sqrt(bn.running_var + pipe.vae.config.batch_norm_eps).view(1, -1, 1, 1)
        ours_vae = Flux2KleinPipeline._unpatchify_latents(ours * std + bn.running_mean.view(1, -1, 1, 1))
        assert torch.allclose(ours_vae, theirs, atol=1e-5), (ours_vae - theirs).abs().max()
        theirs = ours  # compared above in the pipeline's space
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    images = pipe(latents=latents, output_type="pt", **{**kwargs, "prompt": list(prompts)})[0]
    assert torch.allclose(model.decode(ours), images, atol=1e-4)


@pytest.mark.parametrize("name, default", [("flux1", 512), ("sd3", 256)])
def test_t5_prompts_are_encoded_at_the_official_length_or_the_pipelines(name, default, folders):
    """The flux1 and sd3 presets encode T5 at 128 tokens, as the official scripts do; 0 gives the
    pipeline's own default. Either way the embeddings are the pipeline's own at that length."""
    prompts = ["a red circle", "two blue squares"]
    pipe = _pipeline(name, folders[name])
    assert resolve_config(name, "sol_rl").model.max_sequence_length == 128
    for setting, tokens in ((128, 128), (0, default)):
        cond = load_model(_model_config(name, folders[name], f"model.max_sequence_length={setting}"), CPU,
                          torch.float32).encode(prompts)
        if name == "flux1":
            embeds = pipe.encode_prompt(prompts, prompt_2=None, max_sequence_length=tokens)[0]
        else:
            embeds = pipe.encode_prompt(prompts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False,
                                        max_sequence_length=tokens)[0]
        assert cond.embeds.shape[1] == embeds.shape[1] == tokens + (77 if name == "sd3" else 0)
        assert torch.allclose(cond.embeds, embeds.float(), atol=1e-3), setting  # float rounding of two loads
    with pytest.raises(SolrlError, match="model.max_sequence_length=64 applies to the T5-encoded models"):
        resolve_config("sana", "sol_rl", sets=["model.max_sequence_length=64"]).validate()


def test_sana_prompts_carry_no_instruction_unless_asked(folders):
    # The official Sol-RL code calls encode_prompt without the complex human instruction that
    # SanaPipeline.__call__ prepends by default; model.prompt_instruction=true adds it back.
    import inspect

    from diffusers import SanaPipeline

    prompts = ["a red circle", "two blue squares"]
    pipe = _pipeline("sana", folders["sana"])
    instruction = inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default
    assert instruction
    expected = {}
    for flag, chi in (("false", None), ("true", instruction)):
        embeds, mask, _, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False, max_sequence_length=300,
                                                complex_human_instruction=chi)
        cond = load_model(_model_config("sana", folders["sana"], f"model.prompt_instruction={flag}"), CPU,
                          torch.float32).encode(prompts)
        assert torch.equal(cond.mask, mask) and torch.allclose(cond.embeds, embeds), flag
        expected[flag] = cond.embeds
    assert not torch.allclose(expected["false"], expected["true"])
    assert resolve_config("sana", "sol_rl").model.prompt_instruction is False


@pytest.mark.parametrize("name", _marked(("sd35_medium", "zimage", "flux2_klein")))
def test_one_training_iteration(name, folders, tmp_path):
    # run.seed=1: with seed 0 the tiny SANA's two kept images tie on JPEG size, so nothing would train.
    cfg = resolve_config(name, "sol_rl", "jpeg_compressibility",
                         sets=[*FAST, f"model.path={folders[name]}", f"run.run_dir={tmp_path / 'run'}", "run.seed=1"])
    bus = ev.EventBus()
    seen: list[object] = []
    bus.subscribe(seen.append)
    session = train(cfg, bus, stop=StopFlag())
    (it,) = [e for e in seen if isinstance(e, ev.IterationFinished)]
    assert (np.isfinite(it.final.mean) and np.isfinite(it.draft.mean) and np.isfinite(it.loss["loss"])
            and np.isfinite(it.grad_norm))
    assert it.final.std > 0 and it.grad_norm > 0, "the kept samples tied: nothing was trained"
    assert session.run.engine.model.latent_shape[1:] == (LATENT_SIDE.get(name, 16),) * 2
    ckpt = tmp_path / "run" / "checkpoints" / "iter_000001"
    assert (ckpt / "pytorch_lora_weights.safetensors").is_file()
    # The saved LoRA loads through the model's own diffusers pipeline and reproduces the tuned model.
    pipe = _pipeline(name, folders[name])
    pipe.load_lora_weights(str(ckpt))
    cond = session.run.engine.conditioning(["a red circle"])
    x, s = torch.randn(1, *session.run.engine.model.latent_shape), torch.tensor([0.7])
    with torch.no_grad():
        tuned = session.run.engine.model.velocity(session.run.engine.policy.transformer, x, s, cond)
        reloaded = session.run.engine.model.velocity(pipe.transformer, x, s, cond)
        with session.run.engine.policy.use(None) as base:
            untuned = session.run.engine.model.velocity(base, x, s, cond)
    assert torch.allclose(tuned, reloaded, atol=1e-5), (tuned - reloaded).abs().max()
    assert not torch.allclose(tuned, untuned, atol=1e-6)


def _expected_lora_modules(name: str, transformer: torch.nn.Module) -> set[str]:
    if name == "sana":
        return {f"transformer_blocks.{i}.attn{a}.{p}" for i in range(len(transformer.transformer_blocks))
                for a in (1, 2) for p in ("to_q", "to_k", "to_v", "to_out.0")}
    if name == "flux1":
        return ({f"transformer_blocks.{i}.attn.{p}" for i in range(len(transformer.transformer_blocks))
                 for p in ("to_q", "to_k", "to_v", "to_out.0")}
                | {f"single_transformer_blocks.{i}.attn.{p}" for i in range(len(transformer.single_transformer_blocks))
                   for p in ("to_q", "to_k", "to_v")})  # single blocks have no to_out
    if name == "qwen_image":  # every block's joint attention, image and text streams (no context-pre-only block)
        return {f"transformer_blocks.{i}.attn.{p}" for i in range(len(transformer.transformer_blocks))
                for p in ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")}
    if name == "zimage":  # the main layers' and both refiners' attention
        blocks = [f"{part}.{i}" for part in ("layers", "noise_refiner", "context_refiner")
                  for i in range(len(getattr(transformer, part)))]
        return {f"{b}.attention.{p}" for b in blocks for p in ("to_q", "to_k", "to_v", "to_out.0")}
    if name == "flux2_klein":  # double-stream attention, and the single-stream fused QKV (+ MLP in) projection
        return ({f"transformer_blocks.{i}.attn.{p}" for i in range(len(transformer.transformer_blocks))
                 for p in ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")}
                | {f"single_transformer_blocks.{i}.attn.to_qkv_mlp_proj"
                   for i in range(len(transformer.single_transformer_blocks))})
    # SD3 and SD3.5-M: the joint attention only; SD3.5-M's dual attention (attn2) is not a target.
    last = len(transformer.transformer_blocks) - 1  # context-pre-only: no to_add_out
    return {f"transformer_blocks.{i}.attn.{p}" for i in range(last + 1)
            for p in ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
            if not (i == last and p == "to_add_out")}


@pytest.mark.parametrize("name", LOADERS)
def test_lora_targets_are_exactly_the_attention_projections(name):
    torch.manual_seed(0)
    transformer = BUILDERS[name]().transformer
    cfg = resolve_config(name, "sol_rl", "jpeg_compressibility").model
    policy = Policy(transformer, cfg)
    hit = {n for n, m in transformer.named_modules() if isinstance(m, BaseTunerLayer)}
    assert hit and hit == _expected_lora_modules(name, transformer)
    if name == "sd35_medium":  # the MMDiT-X layout is really there, and its second attention is left alone
        assert transformer.transformer_blocks[0].attn2 is not None and not any(".attn2." in n for n in hit)
    assert policy.trainable_parameters()


@pytest.mark.parametrize("name, missing", [("sana", "vae"), ("flux1", "text_encoder_2"), ("sd3", "tokenizer_3")])
def test_a_folder_missing_a_subfolder_is_named(name, missing, folders, tmp_path):
    broken = shutil.copytree(folders[name], tmp_path / name)
    shutil.rmtree(broken / missing)
    with pytest.raises(SolrlError) as err:
        load_model(_model_config(name, broken), CPU, torch.float32)
    assert f"{missing}/" in str(err.value) and "\n" not in str(err.value)


def test_a_folder_without_model_index_or_weights_is_named(folders, tmp_path):
    broken = shutil.copytree(folders["sana"], tmp_path / "sana")
    (broken / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(SolrlError, match="weights in transformer/"):
        load_model(_model_config("sana", broken), CPU, torch.float32)
    (broken / "model_index.json").unlink()
    with pytest.raises(SolrlError, match="model_index.json"):
        load_model(_model_config("sana", broken), CPU, torch.float32)


def test_resolution_must_fit_the_latent_grid(folders):
    with pytest.raises(SolrlError, match="multiple of 4"):
        load_model(_model_config("flux1", folders["flux1"], "model.resolution=30"), CPU, torch.float32)


@pytest.mark.parametrize("name", ["sana", "sana_600m", "sana15", "flux1", "sd3", "sd35_medium", "qwen_image", "zimage",
                                  "flux2_klein",
                                  "wan21_t2v_1_3b", "wan21_t2v_14b",
                                  "wan22_ti2v_5b"])
def test_missing_hub_weights_offline_name_the_hub_id(name, tmp_path, monkeypatch):
    from huggingface_hub import constants

    for var, value in (("HF_HUB_OFFLINE", "1"), ("HF_HOME", str(tmp_path)), ("HF_HUB_CACHE", str(tmp_path / "hub"))):
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = resolve_config(name, "sol_rl", "jpeg_compressibility").model
    with pytest.raises(SolrlError) as err:
        load_model(cfg, CPU, torch.float32)
    text = str(err.value)
    assert cfg.hub_id in err.value.message and "--model-path" in err.value.fix and "model.path=" in err.value.fix
    assert ("HF_TOKEN" in err.value.fix) == (cfg.loader in ("flux1", "sd3"))
    assert "\n" not in text


def test_hub_download_picks_one_weight_variant_and_skips_root_checkpoints():
    files = ["model_index.json", "flux1-dev.safetensors", "ae.safetensors", "README.md",
             "transformer/config.json", "transformer/diffusion_pytorch_model.safetensors.index.json",
             "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
             "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
             "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
             "vae/diffusion_pytorch_model.bf16.safetensors",
             "text_encoder/config.json", "text_encoder/model.bf16-00001-of-00002.safetensors",
             "text_encoder/model.bf16-00002-of-00002.safetensors", "text_encoder/model.safetensors.index.bf16.json",
             "text_encoder/flax_model.msgpack", "tokenizer/tokenizer_config.json", "tokenizer/tokenizer.json",
             "tokenizer/merges.txt", "tokenizer/spiece.model", "scheduler/scheduler_config.json"]
    subs = ("transformer", "vae", "text_encoder", "tokenizer")
    bf16 = set(select_files(files, subs, torch.bfloat16))
    assert ("vae/diffusion_pytorch_model.bf16.safetensors" in bf16
            and "vae/diffusion_pytorch_model.safetensors" not in bf16)
    assert {"flux1-dev.safetensors", "ae.safetensors", "scheduler/scheduler_config.json", "README.md",
            "text_encoder/flax_model.msgpack"}.isdisjoint(bf16)
    assert {"transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
            "text_encoder/model.safetensors.index.bf16.json",
            "tokenizer/tokenizer.json", "tokenizer/merges.txt", "tokenizer/spiece.model", "model_index.json"} <= bf16
    fp32 = set(select_files(files, subs, torch.float32))
    assert ("vae/diffusion_pytorch_model.safetensors" in fp32
            and "vae/diffusion_pytorch_model.bf16.safetensors" not in fp32)
    assert "text_encoder/model.bf16-00001-of-00002.safetensors" in fp32  # the only weights there
    assert weight_choice(["config.json", "model.bf16-00001-of-00002.safetensors"], torch.float32) == ("bf16",
                                                                                                      "safetensors")


def _field(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    s = s.view(-1, *[1] * (x.dim() - 1))
    return torch.sin(3 * x) * (1 + s) - 0.5 * x + s ** 2


@pytest.mark.parametrize("shift, steps", [(3.0, 10), (1.0, 6), (1.8776, 28)])
def test_dpm2_matches_diffusers_dpm_solver_multistep(shift, steps):
    from diffusers import DPMSolverMultistepScheduler

    scheduler = DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=shift,
                                            solver_order=2, algorithm_type="dpmsolver++", final_sigmas_type="zero")
    scheduler.set_timesteps(steps)
    x = torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(0))
    ref = x.clone()
    for i, t in enumerate(scheduler.timesteps):
        ref = scheduler.step(_field(ref, torch.full((3,), float(scheduler.sigmas[i]))), t, ref).prev_sample
    cond = Conditioning(torch.zeros(3, 1, 1), torch.ones(3, 1))
    ours = sample(lambda y, s, c: _field(y, s), x, cond, scheduler.sigmas.float(), "dpm2")
    assert torch.allclose(ours, ref, atol=1e-4)


def test_dpm2_on_our_grid_is_finite_and_first_order_is_euler():
    x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    cond = Conditioning(torch.zeros(2, 1, 1), torch.ones(2, 1))
    one = sigma_grid(1)
    assert torch.equal(sample(lambda y, s, c: _field(y, s), x, cond, one, "dpm2"),
                       sample(lambda y, s, c: _field(y, s), x, cond, one, "euler"))
    out = sample(lambda y, s, c: _field(y, s), x, cond, sigma_grid(10, 3.0), "dpm2")
    assert out.isfinite().all()
    # A straight flow (constant velocity) is integrated exactly by both solvers.
    target = torch.randn_like(x)
    exact = sample(lambda y, s, c: x - target, x, cond, sigma_grid(7, 2.0), "dpm2")
    assert torch.allclose(exact, target, atol=1e-5)


def _fake_hub_cache(tmp_path, monkeypatch, repo: str, folder):  # type: ignore[no-untyped-def]
    """An offline HF cache holding `folder` as the snapshot of `repo` (the cache's own layout)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    storage = cache / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(commit)
    shutil.copytree(folder, storage / "snapshots" / commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return storage / "snapshots" / commit


def test_a_cached_hub_snapshot_loads_offline_and_an_incomplete_one_is_named(folders, tmp_path, monkeypatch):
    snapshot = _fake_hub_cache(tmp_path, monkeypatch, "someone/tiny-sd3", folders["sd3"])
    cfg = resolve_config("sd3", "sol_rl", "jpeg_compressibility", sets=[*FAST, "model.hub_id=someone/tiny-sd3"]).model
    model = load_model(cfg, CPU, torch.float32)
    assert "someone/tiny-sd3" in model.description and model.latent_shape == (4, 16, 16)
    shutil.rmtree(snapshot / "text_encoder_3")
    with pytest.raises(SolrlError, match=r"cached snapshot of someone/tiny-sd3 .* text_encoder_3/"):
        load_model(cfg, CPU, torch.float32)


@pytest.mark.parametrize("name", LOADERS)
def test_infer_runs_on_the_real_architecture_from_a_local_folder(name, folders, tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from solrl_cli.app import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["infer", "--model", name, "--model-path", str(folders[name]), "--prompt",
                                      "a red circle",
                                      "--seeds", "2", "--steps", "2", "--out", "im", "--set", "model.resolution=32",
                                      "--set", "run.device=cpu"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "im" / "images.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == [0, 1] and all((tmp_path / "im" / r["path"]).is_file() for r in rows)
