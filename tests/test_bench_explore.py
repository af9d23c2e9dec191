"""`solrl bench --explore` (one denoising step per explore backend) end to end at tiny size on a CPU,
its skips and refusals, and `solrl bench --size real`'s memory check before building, on made-up
GPUs. No test checks a timing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core.bench import run as bench_run
from solrl_core.bench.explore import skip_reason
from solrl_core.bench.fits import check_fits, estimate
from solrl_core.errors import SolrlError
from solrl_core.precision.hardware import GpuInfo

pytest.importorskip("diffusers")
runner = CliRunner()
CUDA = torch.device("cuda", 0)  # a device object only: the memory check reads the made-up GPU, never CUDA


def test_explore_times_each_backend_and_skips_fp8_on_a_cpu(tmp_path):
    out = tmp_path / "explore.json"
    result = runner.invoke(app, ["bench", "--explore", "--size", "tiny", "--device", "cpu", "--no-compile",
                                 "--rollout-batch", "2",
                                 "--iterations", "2", "--warmup", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["device"].startswith("cpu (") and data["options"]["models"] == ["sana"]
    steps = {r["backend"]: r for r in data["rows"] if "seconds" in r}
    assert set(steps) == {"bf16", "fp8-e5m2-tensor",
                          "nvfp4-emulated"} and not any(r["compiled"] for r in steps.values())
    assert steps["bf16"]["rel_error"] == 0.0  # the reference against itself
    assert 0.0 < steps["fp8-e5m2-tensor"]["rel_error"] < 0.5 and 0.0 < steps["nvfp4-emulated"]["rel_error"] < 0.5
    assert {r["backend"] for r in data["rows"] if "refresh_seconds" in r} == {"fp8-e5m2-tensor", "nvfp4-emulated"}
    (fp8,) = [r for r in data["rows"] if r["backend"] == "fp8"]
    assert fp8["skipped"].startswith("no GPU: FP8 GEMMs need") and "--numerics-only" in fp8["skipped"]
    for text in ("sana: one denoising step at batch 2, tiny size", "speed-up over eager bf16", "not timed: fp8: no GPU",
                 "fp8-e5m2-tensor refresh", "error vs bf16", "speed-up: over eager bf16"):
        assert text in result.output, text


def test_fp8_runs_on_a_cpu_through_the_reference_kernels_only_when_asked():
    cpu = torch.device("cpu")
    assert "--numerics-only" in skip_reason("fp8", cpu, numerics_only=False)
    assert skip_reason("fp8", cpu, numerics_only=True) == ""
    assert skip_reason("nvfp4-emulated", cpu, False) == "" and skip_reason("fp8-e5m2-tensor", cpu, False) == ""
    assert skip_reason("fp8-torchao", cpu, True) == "" and "--numerics-only" in skip_reason("fp8-torchao", cpu, False)
    assert "no GPU: NVFP4 GEMMs need" in skip_reason("nvfp4", cpu, True)  # no CPU kernel for float4: said, never run


def test_explore_refuses_what_does_not_apply_and_real_size_on_a_cpu():
    result = runner.invoke(app, ["bench", "--explore", "--size", "tiny", "--device", "cpu", "--family", "sol_rl"])
    assert result.exit_code == 2 and "--family does not apply to --explore" in result.output
    result = runner.invoke(app, ["bench", "--explore", "--device", "cpu"])
    assert (result.exit_code == 2 and "real sizes need a GPU" in result.output
            and "--size tiny --device cpu" in result.output)
    assert "Traceback" not in result.output


def _configs(model: str, *sets: str, families=bench_run.FAMILIES) -> dict:
    options = bench_run.BenchOptions(model=model, families=tuple(families), sets=sets).resolved()
    return {f: bench_run.family_config(options, f, Path("unbuilt")) for f in options.families}


def test_a_family_that_fits_is_not_refused():
    h100, configs = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.1), _configs("sana")
    peaks = {family: estimate(cfg, CUDA, h100)[0] for family, cfg in configs.items()}
    assert set(peaks) == set(bench_run.FAMILIES) and all(12.0 < peak <= h100.memory_gib
                                                         for peak in peaks.values()), peaks
    assert check_fits(configs, CUDA, h100) is None  # every family under the H100's memory: none refused
    assert check_fits(configs, torch.device("cpu"), None) is None  # no GPU found: nothing to check


def test_over_the_estimate_names_the_largest_micro_batch_that_fits():
    # SANA's sol_rl estimate is 12.2 GiB at the preset's micro-batch of 16 (its lean fp8 copy 1.5 GiB)
    with pytest.raises(SolrlError,
                       match=r"sol_rl does not fit on cuda:0 made-up.*12 GiB by the doctor's estimate") as info:
        check_fits(_configs("sana", families=("sol_rl",)), CUDA, GpuInfo(0, "made-up", (9, 0), 12.0))
    micro, peak = re.search(r"--micro-batch (\d+) \(estimate ([\d.]+) GiB\)", info.value.fix).groups()
    assert int(micro) < 16 and float(peak) <= 12.0
    assert "not building" in info.value.message and "--skip-memory-check" in info.value.fix


def test_a_forced_rollout_copy_is_named_when_dropping_it_fits():
    with pytest.raises(SolrlError) as info:
        check_fits(_configs("sana", "sampler.rollout_copy=true", families=("sol_rl",)), CUDA,
                   GpuInfo(0, "made-up", (9, 0), 14.0))
    assert "--set sampler.rollout_copy=false" in info.value.fix and "rollout copy 3.0" in info.value.message


def test_weights_over_the_gpu_say_no_setting_fits():
    with pytest.raises(SolrlError) as info:
        check_fits(_configs("flux1", families=("naive_scaling",)), CUDA, GpuInfo(0, "made-up", (8, 9), 24.0))
    assert "no single setting the bench can lower" in info.value.fix and "more memory" in info.value.fix


def test_real_size_bench_refuses_before_building(monkeypatch):
    from solrl_core.plan import resolve
    from solrl_core.runtime import device as device_mod

    monkeypatch.setattr(device_mod, "resolve_device", lambda name: CUDA)
    monkeypatch.setattr(resolve, "gpu_of", lambda device: GpuInfo(0, "made-up", (9, 0), 8.0))
    monkeypatch.setattr(bench_run, "_build", lambda *a, **k: pytest.fail("built although the estimate does not fit"))
    result = runner.invoke(app, ["bench", "--model", "sana", "--family", "compile"])
    assert result.exit_code == 2, result.output
    assert "compile does not fit on cuda:0 made-up" in result.output and "more memory" in result.output
