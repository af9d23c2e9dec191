"""Explore-precision selection: auto picks the emulation on a CPU; nvfp4 and fp8 are checked against
the machine and refused with what would work."""

from __future__ import annotations

import pytest
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.plan.resolve import resolve_machine
from solrl_core.precision import hardware

H100 = hardware.GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.6)
A100 = hardware.GpuInfo(0, "NVIDIA A100-SXM4-40GB", (8, 0), 39.4)
L4 = hardware.GpuInfo(0, "NVIDIA L4", (8, 9), 22.0)
CUDA = torch.device("cuda", 0)


def test_auto_on_a_cpu_is_the_exact_emulation_uncompiled_with_a_rollout_copy():
    cfg = resolve_config("tiny", "sol_rl", sets=["explore.precision=auto"])
    machine = resolve_machine(cfg, torch.device("cpu"), "fp32")
    assert machine.explore_precision == "nvfp4-emulated" and "CPU" in machine.explore_why
    assert not machine.explore_compile and not machine.rollout_compile and not machine.checkpointing
    assert machine.rollout_copy and not machine.update_compile
    hardware.require_explore_precision("nvfp4-emulated", "cpu")


def test_auto_on_a_gpu_is_fp8_compiled_from_ada_on_and_never_the_emulation():
    sana = resolve_config("sana", "sol_rl")
    h100 = resolve_machine(sana, CUDA, "bf16", gpu=H100)
    assert (h100.explore_precision, h100.explore_compile, h100.rollout_compile, h100.update_compile) == ("fp8", True,
                                                                                                         True, True)
    assert "update compiled" in h100.describe()
    assert "9.0" in h100.explore_why
    a100 = resolve_machine(sana, CUDA, "bf16", gpu=A100)
    assert a100.explore_precision == "bf16" and "below 8.9" in a100.explore_why
    off = resolve_machine(resolve_config("sana", "sol_rl", sets=["explore.compile=false", "sampler.compile=false",
                                                                 "optimizer.compile=false"]), CUDA, "bf16", gpu=H100)
    assert off.explore_compile and not off.rollout_compile and not off.update_compile  # fp8 is compiled all the same
    assert "update eager" in off.describe() and "compiled although explore.compile=false" in off.describe()
    eager = resolve_machine(resolve_config("sana", "sol_rl", sets=["explore.compile=false", "explore.precision=bf16"]),
                            CUDA, "bf16", gpu=H100)
    assert not eager.explore_compile and "although" not in eager.describe()
    cpu = resolve_machine(resolve_config("tiny", "sol_rl", sets=["explore.precision=fp8", "explore.compile=false"]),
                          torch.device("cpu"), "fp32")
    assert not cpu.explore_compile  # a CPU's fp8 path is a numerics check, not a speed path


def test_a_copy_a_calibration_builds_is_compiled_as_the_plan_says():
    """Engine.explore_copy_at asks the plan (MachinePlan.explore_compiled_at) whether a copy at another
    precision is compiled: where the run's is, an fp8 one on CUDA always, none under cpu-blocks."""
    import dataclasses

    from solrl_core.plan.plan import MemoryModes

    eager = resolve_machine(resolve_config("sana", "sol_rl", sets=["explore.compile=false", "explore.precision=bf16"]),
                            CUDA, "bf16", gpu=H100)
    assert eager.explore_compiled_at("fp8") and not eager.explore_compiled_at("nvfp4-emulated")
    h100 = resolve_machine(resolve_config("sana", "sol_rl"), CUDA, "bf16", gpu=H100)
    assert h100.explore_compiled_at("nvfp4-emulated") and h100.explore_compiled_at("fp8")
    blocks = dataclasses.replace(h100, memory=MemoryModes("cpu-blocks", True, True))
    assert not blocks.explore_compiled_at("fp8")
    cpu = resolve_machine(resolve_config("tiny", "sol_rl"), torch.device("cpu"), "fp32")
    assert not cpu.explore_compiled_at("fp8") and not cpu.explore_compiled_at("nvfp4-emulated")


def test_the_rollout_copy_and_checkpointing_follow_the_memory_estimate():
    sana = resolve_config("sana", "sol_rl")
    h100 = resolve_machine(sana, CUDA, "bf16", gpu=H100)
    assert h100.rollout_copy and not h100.checkpointing  # SANA-1.6B at micro-batch 16 fits 80 GB without it
    flux_small = resolve_machine(resolve_config("flux1", "sol_rl"), CUDA, "bf16", gpu=L4)
    assert not flux_small.rollout_copy and "old adapter" in flux_small.rollout_copy_why
    assert flux_small.checkpointing and "over" in flux_small.checkpointing_why
    forced = resolve_machine(resolve_config("flux1", "sol_rl", sets=["sampler.rollout_copy=true",
                                                                     "optimizer.checkpointing=false"]), CUDA, "bf16",
                             gpu=L4)
    assert forced.rollout_copy and not forced.checkpointing
    # the family is the copy
    assert resolve_machine(resolve_config("flux1", "compile"), CUDA, "bf16", gpu=L4).rollout_copy


@pytest.mark.parametrize("precision, why", [("nvfp4", "compute capability >= 10.0"), ("fp8",
                                                                                      "compute capability >= 8.9")])
def test_real_low_precisions_without_the_hardware_name_what_works(precision, why):
    with pytest.raises(SolrlError) as err:
        hardware.require_explore_precision(precision, "cpu")
    assert why in err.value.message and "does not run on the CPU" in err.value.message
    assert (err.value.fix == "this machine supports: nvfp4-emulated, fp8-e5m2-tensor, fp8-e5m2-delayed, bf16, fp32; "
                             "use --explore-precision nvfp4-emulated")


def test_fp8_is_accepted_on_hopper_and_offered_instead_of_nvfp4(monkeypatch):
    hopper = hardware.GpuInfo(0, "NVIDIA H100", (9, 0), 80.0)
    monkeypatch.setattr(hardware, "gpus", lambda: [hopper])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    hardware.require_explore_precision("fp8", "cuda:0")
    with pytest.raises(SolrlError) as err:
        hardware.require_explore_precision("nvfp4", "cuda:0")
    assert (err.value.fix == "this machine supports: fp8, nvfp4-emulated, fp8-e5m2-tensor, fp8-e5m2-delayed, bf16, "
                             "fp32; use --explore-precision fp8")
    b200 = hardware.GpuInfo(0, "NVIDIA B200", (10, 0), 180.0)
    monkeypatch.setattr(hardware, "gpus", lambda: [b200])
    monkeypatch.setattr("solrl_core.precision.nvfp4_gemm.torchao_missing", lambda: "torchao is not installed (pip "
                                                                                   "install torchao)")
    with pytest.raises(SolrlError, match="compute capability 10.0 is enough, but torchao is not installed") as err:
        hardware.require_explore_precision("nvfp4", "cuda:0")
    assert err.value.fix.endswith("use --explore-precision fp8")
