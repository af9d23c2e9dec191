"""solrl doctor: the machine checks, the explore-precision rules, and the command's table, JSON and exit code."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import sys
import types

import pytest
import typer
from typer.testing import CliRunner

from solrl_cli.doctor_cmd import doctor
from solrl_core import doctor as doc
from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.plan.footprint import COMPILED_ACTIVATION_SHARE, estimate_memory, model_size
from solrl_core.precision import hardware
from solrl_core.precision.hardware import GpuInfo

app = typer.Typer()
app.command("doctor")(doctor)


@app.callback()
def _root() -> None:
    """Keeps `doctor` a subcommand, as in the real app."""


runner = CliRunner()
WIDE = {"COLUMNS": "400"}  # one table row per line, so the assertions see whole sentences

H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.1)
B200 = GpuInfo(0, "NVIDIA B200", (10, 0), 178.4)
REWARD_PACKAGES = ("ImageReward", "open_clip", "torchvision")


@pytest.fixture(autouse=True)
def cpu_machine(monkeypatch):
    """Every test sees this machine as it is in CI: no GPU (tests that want one patch it in)."""
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)


def _invoke(*args):
    return runner.invoke(app, ["doctor", *args], env=WIDE)


def _by_name(entries):
    return {e["name"]: e for e in entries}


# --- the command -----------------------------------------------------------------------------------

def test_tiny_model_passes_on_this_machine():
    result = _invoke()
    assert result.exit_code == 0, result.output
    rows = result.stdout.splitlines()  # a line a check
    assert any("python" in r and "Python 3." in r and "pass" in r for r in rows)
    assert any("torch" in r and "torch 2." in r for r in rows)
    assert "nothing blocks this run" in result.stdout


def test_nvfp4_on_flux_fails_and_names_what_works_here():
    result = _invoke("--model", "flux1", "--explore-precision", "nvfp4")
    assert result.exit_code == 1, result.output
    assert "this machine supports: nvfp4-emulated, fp8-e5m2-tensor, fp8-e5m2-delayed, bf16, fp32" in result.stdout
    assert "--explore-precision nvfp4-emulated" in result.stdout


def test_json_lists_every_check():
    result = _invoke("--json")
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)
    assert entries and all({"name", "status", "detail", "fix", "needed_by_run"} <= set(e) for e in entries)
    assert all(e["status"] in ("pass", "warn", "fail") for e in entries)
    names = _by_name(entries)
    assert {"python", "torch", "model weights", "explore precision", "memory estimate"} <= set(names)
    assert names["memory estimate"]["detail"].startswith("skipped: no GPU")


@pytest.mark.skipif(any(importlib.util.find_spec(p) is None for p in REWARD_PACKAGES),
                    reason='needs the reward backends: pip install -e ".[rewards]"')
def test_reward_backends_import_here():
    entries = _by_name(json.loads(_invoke("--reward", "imagereward=1.0,hpsv2=0.5,pickscore=0.5", "--json").stdout))
    backends = {n: e for n, e in entries.items() if n.startswith("reward backend")}
    assert len(backends) == 3
    assert all(e["status"] == "pass" and e["needed_by_run"] for e in backends.values()), backends
    assert entries["torchvision"]["status"] == "pass"


def test_offline_with_an_empty_cache_fails_on_missing_weights(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # huggingface_hub read the env at import
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    result = _invoke("--model", "sana", "--reward", "imagereward", "--json")
    assert result.exit_code == 1, result.output
    entries = _by_name(json.loads(result.stdout))
    model = entries["model weights"]
    assert model["status"] == "fail" and model["needed_by_run"]
    assert "Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers" in model["fix"] and "--model-path" in model["fix"]
    weights = entries["reward weights imagereward"]
    assert weights["status"] == "fail" and weights["needed_by_run"]
    assert "THUDM/ImageReward" in weights["fix"] and "bert-base-uncased" in weights["fix"]
    assert "reward.paths.imagereward" in weights["fix"]
    assert "HF_HUB_OFFLINE=1" in entries["hub mode"]["detail"]


def test_local_reward_folder_and_model_path_are_checked(tmp_path):
    ir = tmp_path / "ir"
    (ir / "tokenizer").mkdir(parents=True)
    (ir / "ImageReward.pt").write_bytes(b"")
    (ir / "med_config.json").write_text("{}")
    cfg = resolve_config("sana", "sol_rl", "imagereward", sets=[f"reward.paths.imagereward={ir}"])
    checks = {c.name: c for c in doc.run_checks(cfg)}
    assert checks["reward weights imagereward"].status == "pass"
    # refused as the config is resolved, before any check
    with pytest.raises(SolrlError, match="nowhere does not exist"):
        resolve_config("sana", "sol_rl", "imagereward", sets=[f"model.path={tmp_path / 'nowhere'}"])


def _recording_backends(monkeypatch, probed):  # type: ignore[no-untyped-def]
    """The registry's backends, each probe replaced by one that records the rewards it serves."""
    from dataclasses import replace

    registry = importlib.import_module("solrl_core.rewards.registry")  # the package's `registry` is a function
    real = registry.backends()
    recording = {replace(b, probe=lambda label=", ".join(serves): probed.append(label)): serves
                 for b, serves in real.items()}
    monkeypatch.setattr(doc.software, "backends", lambda: recording)
    return [", ".join(serves) for serves in real.values()]


def test_a_runs_preflight_probes_only_the_reward_backends_the_run_uses(monkeypatch):
    probed = []
    every = _recording_backends(monkeypatch, probed)
    names = {c.name for c in doc.run_checks(resolve_config("tiny", "sol_rl", "jpeg_compressibility"), only_needed=True)}
    assert probed == [] and "torchvision" not in names and not any(n.startswith("reward backend") for n in names)
    names = {c.name for c in doc.run_checks(resolve_config("sana", "sol_rl", "imagereward"), only_needed=True)}
    assert probed == ["imagereward"] and {"torchvision", "reward backend imagereward"} <= names
    probed.clear()
    doc.run_checks(resolve_config("tiny", "sol_rl", "jpeg_compressibility"))  # the doctor itself shows every backend
    assert probed == every


def test_a_video_reward_on_clip_has_its_backend_checked_with_the_other_clip_rewards(monkeypatch):
    """temporal_consistency scores with transformers' CLIP, as pickscore and clipscore do: the
    registry says so, so the preflight of a run that uses it imports that backend."""
    probed = []
    _recording_backends(monkeypatch, probed)
    cfg = resolve_config("tiny_video", "sol_rl", "temporal_consistency=0.5,tinyvideo_geneval=1.0")
    names = {c.name for c in doc.run_checks(cfg, only_needed=True)}
    assert probed == ["pickscore, clipscore, temporal_consistency"]
    assert "reward backend pickscore, clipscore, temporal_consistency" in names and "torchvision" not in names


def test_the_doctor_reads_a_rewards_backend_and_install_hint_from_its_registry_entry(monkeypatch):
    """A reward declared once in the registry, with a backend that does not import here and needs
    torchvision: the preflight fails on that backend with the install hint the entry gives, and
    checks torchvision for it, with no other list to keep in step."""
    from dataclasses import replace

    registry = importlib.import_module("solrl_core.rewards.registry")  # the package's `registry` is a function
    def missing() -> None:
        raise ImportError("No module named 'ocrlib'")

    backend = registry.Backend(missing, "pip install ocrlib==2.1", torchvision=True)
    ocr = replace(registry.BUILTIN["jpeg_compressibility"], name="ocr_score", backend=backend)
    monkeypatch.setattr(registry, "BUILTINS", (*registry.BUILTINS, ocr))
    monkeypatch.setitem(registry.BUILTIN, "ocr_score", ocr)
    checks = {c.name: c for c in doc.run_checks(resolve_config("tiny", "sol_rl", "ocr_score"), only_needed=True)}
    row = checks["reward backend ocr_score"]
    assert row.status == "fail" and row.needed_by_run and row.fix == "pip install ocrlib==2.1"
    assert "ocrlib" in row.detail
    assert "torchvision" in checks and checks["torchvision"].needed_by_run
    assert checks["torchvision"].status == "pass" or "ocr_score" in checks["torchvision"].detail


# --- explore precisions: the rules, with made-up GPUs ---------------------------------------------

def test_hopper_runs_fp8_but_not_nvfp4():
    p = hardware.explore_precisions(H100, torchao_missing=lambda: "")
    assert p["fp8"][0] and not p["nvfp4"][0]
    assert "10.0" in p["nvfp4"][1]
    assert hardware.supported(p) == ["fp8", "nvfp4-emulated", "fp8-e5m2-tensor", "fp8-e5m2-delayed", "bf16", "fp32"]


def test_fp8_needs_only_torch_on_ada_and_newer():
    for gpu in (H100, B200, GpuInfo(0, "NVIDIA L40S", (8, 9), 48.0)):
        assert hardware.explore_precisions(gpu)["fp8"] == (True, "FP8 e4m3 GEMMs through torch._scaled_mm")
    ok, why = hardware.explore_precisions(GpuInfo(0, "NVIDIA A100", (8, 0), 80.0))["fp8"]
    assert not ok and "8.0 < 8.9" in why


def test_blackwell_runs_nvfp4_through_torchao_and_says_why_not_without_it():
    p = hardware.explore_precisions(B200, torchao_missing=lambda: "")
    assert p["nvfp4"][0] and p["fp8"][0] and "torchao" in p["nvfp4"][1]
    ok, why = hardware.explore_precisions(B200,
            torchao_missing=lambda: "torchao is not installed (pip install torchao)")["nvfp4"]
    assert not ok and "torchao is not installed" in why


def test_cpu_and_old_gpus():
    cpu = hardware.explore_precisions(None)
    assert hardware.supported(cpu) == ["nvfp4-emulated", "fp8-e5m2-tensor", "fp8-e5m2-delayed", "bf16", "fp32"]
    turing = hardware.explore_precisions(GpuInfo(0, "T4", (7, 5), 15.0))
    assert hardware.supported(turing) == ["nvfp4-emulated", "fp8-e5m2-tensor", "fp8-e5m2-delayed", "fp32"]


def test_transformer_engine_probed_over_its_known_api_names(monkeypatch):
    """TE >= 2.9 answers through te.pytorch.is_nvfp4_available(return_reason=True); older releases
    through transformer_engine.pytorch.fp8.check_fp8_support(): both are found."""
    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    reason = "Device compute capability 10.0 or higher required for NVFP4 execution."
    module("transformer_engine", __version__="2.9.0")
    module("transformer_engine.pytorch",
           is_nvfp4_available=lambda return_reason=False: (False, reason) if return_reason else False)
    module("transformer_engine.pytorch.fp8", check_fp8_support=lambda: (True, ""))
    assert hardware.transformer_engine_status() == (True, "2.9.0", "")
    assert hardware.te_support("nvfp4", H100) == (False, reason)
    assert hardware.te_support("fp8", H100) == (True, "")
    assert hardware.te_support("fp8", None) is None


def test_explore_precision_check_with_a_gpu(monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [H100])
    monkeypatch.setattr(hardware, "te_support", lambda kind, gpu: None)
    checks = {c.name: c for c in doc.run_checks(resolve_config("flux1", "sol_rl"), nproc=2, explore_precision="nvfp4")}
    assert (checks["explore precision"].status == "fail"
            and "compute capability 9.0 < 10.0" in checks["explore precision"].detail)
    assert checks["processes"].status == "fail" and checks["processes"].fix == "--nproc-per-node 1"
    assert checks["run device"].status == "pass" and "H100" in checks["run device"].detail
    assert checks["gpu cuda:0"].needed_by_run


def test_unused_explore_precision_does_not_block_other_families():
    checks = {c.name: c for c in doc.run_checks(resolve_config("tiny", "diffusionnft"), explore_precision="nvfp4")}
    assert checks["explore precision"].status == "warn" and not checks["explore precision"].needed_by_run
    assert not doc.failed_for_run(list(checks.values()))


@pytest.mark.parametrize("gpu", [None, H100, B200], ids=["cpu", "sm_90", "sm_100"])
def test_the_doctor_and_a_run_agree_on_the_explore_precision_and_the_gate(gpu, monkeypatch):
    """For every family, with explore.compile auto and off: the explore precision the doctor names, why,
    whether the run depends on it, and the explore copy it estimates are the run's own plan
    (resolve.resolve_plan, what open_session takes), on a faked sm_90, sm_100 and the CPU."""
    import torch

    from solrl_core.config.families import FAMILIES
    from solrl_core.doctor.strategy import strategy_check
    from solrl_core.plan.resolve import resolve_plan

    monkeypatch.setattr(hardware, "gpus", lambda: [gpu] if gpu is not None else [])
    monkeypatch.setattr(hardware, "te_support", lambda kind, gpu: None)
    device = torch.device("cuda", 0) if gpu is not None else torch.device("cpu")
    for family in FAMILIES:
        for sets in ([], ["explore.compile=false"]):
            cfg = resolve_config("sana" if gpu is not None else "tiny", family, sets=sets)
            run = resolve_plan(cfg, device, "bf16" if gpu is not None else "fp32", gpu=gpu)
            explore = doc._explore(cfg, gpu, None)
            assert explore.detail.startswith(f"auto -> {run.machine.explore_precision} on ")
            assert f"({run.machine.explore_why})" in explore.detail
            assert explore.needed_by_run == run.low_precision == (family in ("sol_rl", "naive_quant"))
            if gpu is None:
                continue
            copy = estimate_memory(cfg, run.explore_precision, run.full_precision).explore_copy
            assert f"explore copy {copy:.1f} ({run.machine.explore_precision})" in doc._memory(cfg, gpu, None).detail
            assert (copy > 0) == run.explores_low
            assert f"this run: {run.machine.strategy} (auto)" in strategy_check(cfg, gpu, 1).detail


# --- memory estimate and small helpers -------------------------------------------------------------

def test_memory_estimate_orders_and_limits():
    flux = resolve_config("flux1", "sol_rl")
    emulated, real = estimate_memory(flux, "nvfp4-emulated"), estimate_memory(flux, "nvfp4")
    # one bf16 copy (the fake-quantized cache) vs half one
    assert emulated.explore_copy == pytest.approx(2 * real.explore_copy)
    assert estimate_memory(resolve_config("flux1", "naive_scaling"), "bf16").explore_copy == 0
    with_copy = estimate_memory(resolve_config("flux1", "compile"), "bf16", rollout_copy=True)
    assert with_copy.rollout_copy == pytest.approx(real.policy) and with_copy.peak > real.peak - real.explore_copy
    no_ckpt = estimate_memory(flux, "nvfp4", checkpointing=False)
    assert no_ckpt.activations > 5 * real.activations
    assert doc._memory(flux, GpuInfo(0, "small", (9, 0), 24.0), "nvfp4").status == "fail"
    sana = doc._memory(resolve_config("sana", "sol_rl"), H100, "auto")
    assert sana.status == "pass" and "explore copy on, rollout copy on, update on" in sana.detail
    eager = doc._memory(resolve_config("sana", "sol_rl", sets=["optimizer.compile=false"]), H100, "auto")
    assert "update off" in eager.detail
    assert "estimate" in doc._memory(flux, H100, "nvfp4").detail


def test_a_compiled_update_is_estimated_with_its_smaller_activations():
    """Calibrated on SANA-1.6B on an H100 (footprint.COMPILED_ACTIVATION_SHARE): the estimate of the
    benchmark's settings lands within a few percent of the peaks measured there (55.97 GiB sol_rl,
    52.02 GiB compile, less the real VAE the benchmark's small pipeline lacked)."""
    sets = ["explore.group_size=96", "selection.group_size=24", "run.prompts_per_iteration=1"]
    for family, precision, measured in (("sol_rl", "fp8", 55.97), ("compile", "bf16", 52.02)):
        cfg = resolve_config("sana", family, sets=sets)
        eager = estimate_memory(cfg, precision, checkpointing=False, rollout_copy=True)
        compiled = estimate_memory(cfg, precision, checkpointing=False, rollout_copy=True, compiled_update=True)
        assert compiled.activations == pytest.approx(eager.activations * COMPILED_ACTIVATION_SHARE)
        assert abs(compiled.peak - compiled.vae - measured) / measured < 0.05 < abs(eager.peak - eager.vae
                                                                                    - measured) / measured
        checkpointed = [estimate_memory(cfg, precision, rollout_copy=True, compiled_update=c).activations
                        for c in (False, True)]
        assert checkpointed[0] == checkpointed[1]  # measured without checkpointing only


def test_matching_torchvision():
    assert doc.matching_torchvision("2.13.0+cpu") == "0.28.0"
    assert doc.matching_torchvision("2.4.1") == "0.19.1"


def test_reward_file_table_matches_the_backends():
    pytest.importorskip("open_clip")
    from solrl_core.rewards import clip_rewards, hpsv2, imagereward
    from solrl_core.rewards.registry import BUILTINS

    hub = {r.name: r.hub_files for r in BUILTINS if r.hub_files}
    assert set(hub) == {r.name for r in BUILTINS if r.weights} == {r.name for r in BUILTINS if r.local_files}
    repos = {name: {repo for repo, _ in needs} for name, needs in hub.items()}
    files = {name: {f for _, names in needs for f in names} for name, needs in hub.items()}
    assert repos["imagereward"] == {imagereward.HUB_ID, imagereward.TOKENIZER_ID}
    assert {imagereward.CHECKPOINT, imagereward.MED_CONFIG} <= files["imagereward"]
    assert repos["pickscore"] == {clip_rewards.PickScore.model_id, clip_rewards.PickScore.processor_id}
    assert repos["clipscore"] == {clip_rewards.ClipScore.model_id, clip_rewards.ClipScore.processor_id}
    assert repos["hpsv2"] == {hpsv2.HUB_REPO} and files["hpsv2"] == {hpsv2.CHECKPOINT}


def test_new_model_presets_have_their_own_footprint_and_a_20b_model_names_what_fits():
    from solrl_core.plan.footprint import MODEL_SIZES

    names = ("sd35_medium", "qwen_image", "zimage", "flux2_klein", "wan21_t2v_1_3b", "wan21_t2v_14b", "wan22_ti2v_5b")
    labels = {name: model_size(resolve_config(name, "sol_rl")).label for name in names}
    assert len(set(labels.values())) == 7 and MODEL_SIZES["sana"].label not in labels.values()
    assert "SD3.5-Medium" in labels["sd35_medium"] and "Qwen-Image 20B" in labels["qwen_image"]
    # Qwen-Image's 20B transformer with its lean fp8 copy fits an 80 GB H100 within 10% (a warning), and
    # cannot fit a 64 GB GPU: the check says so before anything loads, and names the precision that
    # fits (bf16: rollouts on the policy).
    assert doc._memory(resolve_config("qwen_image", "sol_rl"), H100, "auto").status == "warn"
    check = doc._memory(resolve_config("qwen_image", "sol_rl"), GpuInfo(0, "a 64 GB GPU", (9, 0), 64.0), "auto")
    assert check.status == "fail" and "Qwen-Image" in check.detail
    assert "--explore-precision bf16" in check.fix and "no separate copy" in check.fix
    assert doc._memory(resolve_config("zimage", "sol_rl"), H100, "auto").status == "pass"


def test_memory_estimate_without_a_gpu_still_gives_a_real_models_figure():
    check = doc._memory_without_gpu(resolve_config("qwen_image", "sol_rl"), None)
    assert check.status == "pass" and check.detail.startswith("skipped: no GPU") and not check.needed_by_run
    assert "on a GPU in bf16 with a fp8 explore copy" in check.detail and "Qwen-Image 20B" in check.detail
    assert "with a bf16 explore copy" in doc._memory_without_gpu(resolve_config("qwen_image", "sol_rl"), "bf16").detail
    assert "on a GPU" not in doc._memory_without_gpu(resolve_config("tiny", "sol_rl"), None).detail
    names = {c.name: c for c in doc.run_checks(resolve_config("qwen_image", "sol_rl"))}
    assert "Qwen-Image 20B" in names["memory estimate"].detail or names["memory estimate"].detail.startswith("estimate")


def test_on_a_cpu_the_tiny_doctor_is_short_and_the_memory_mode_table_is_behind_a_flag():
    """At 80 columns the table of every preset's memory mode per GPU size was ~70 of its ~140 lines."""
    from solrl_core.doctor.modes import modes_check

    short = runner.invoke(app, ["doctor"], env={"COLUMNS": "80"})
    assert short.exit_code == 0, short.output
    assert "memory modes" not in short.output and "flux1: 24 GB" not in short.output
    assert len(short.output.splitlines()) < 100, short.output
    assert "--memory-modes" in runner.invoke(app, ["doctor", "--help"], env=WIDE).output
    tiny = resolve_config("tiny", "sol_rl")
    assert modes_check(tiny) is None and "zimage: 24 GB: " in modes_check(tiny, every=True).detail
    own = modes_check(resolve_config("sana", "sol_rl")).detail  # a real model: its own row, no other
    assert "sana: 24 GB: " in own and "flux1" not in own


def test_the_explore_backends_row_on_the_cpu_and_on_simulated_gpus():
    """Which kernel each explore precision would use and whether it is measured there: on this CPU,
    and with --gpu-capability as if on sm_90 / sm_100 (precision/backends.py)."""
    from solrl_core.doctor.backends import backends_check, simulated_gpu

    result = _invoke("--json", "--gpu-capability", "10.0")
    row = _by_name(json.loads(result.stdout))["explore backends"]
    assert row["detail"].startswith("on a simulated GPU of compute capability 10.0") and not row["needed_by_run"]
    assert "nvfp4 -> torchao (torchao NVFP4Tensor, torch._scaled_mm on float4), unmeasured on this GPU" in row["detail"]
    cpu = backends_check(None, "scaled_mm").detail
    assert "nvfp4: not here (no GPU" in cpu and "nvfp4-emulated -> emulation (torch, numerics only)" in cpu
    assert cpu.count("no speed figure on a CPU") == 1  # said once for the row
    hopper = backends_check(simulated_gpu("9.0"), "torchao", simulated=True).detail
    assert "nvfp4: not here (compute capability 9.0 < 10.0" in hopper
    assert "fp8 -> torchao (torchao Float8Tensor, PerRow dynamic), unmeasured on this GPU" in hopper
    assert "fp8 -> scaled_mm (solrl's torch._scaled_mm wrapper, row-wise e4m3), measured, docs/BENCHMARKS.md" in \
        backends_check(simulated_gpu("9.0"), "scaled_mm", simulated=True).detail
    bad = _invoke("--gpu-capability", "ten")
    assert bad.exit_code == 2 and "is not MAJOR.MINOR" in bad.output
