"""Explore-precision selection: auto picks the emulation on a CPU; nvfp4 and fp8 are checked against
the machine and refused with what would work."""

from __future__ import annotations

import pytest
import torch

from solrl_core import hardware
from solrl_core.errors import SolrlError
from solrl_core.presets import resolve_config
from solrl_core.session import plan_stages


def test_auto_on_a_cpu_is_the_exact_emulation():
    cfg = resolve_config("tiny", "sol_rl", sets=["explore.precision=auto"])
    assert plan_stages(cfg, "fp32").explore_precision == "nvfp4-emulated"
    hardware.require_explore_precision("nvfp4-emulated", "cpu")


@pytest.mark.parametrize("precision, why", [("nvfp4", "compute capability >= 10.0"), ("fp8", "compute capability >= 8.9")])
def test_real_low_precisions_without_the_hardware_name_what_works(precision, why):
    with pytest.raises(SolrlError) as err:
        hardware.require_explore_precision(precision, "cpu")
    assert why in err.value.message and "does not run on the CPU" in err.value.message
    assert err.value.fix == "this machine supports: nvfp4-emulated, bf16, fp32; use --explore-precision nvfp4-emulated"


def test_supported_but_unimplemented_is_said_plainly(monkeypatch):
    b200 = hardware.GpuInfo(0, "NVIDIA B200", (10, 0), 180.0)
    monkeypatch.setattr(hardware, "gpus", lambda: [b200])
    monkeypatch.setattr(hardware, "te_support", lambda kind, gpu: (True, ""))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(SolrlError, match="not in this version") as err:
        hardware.require_explore_precision("nvfp4", "cuda:0")
    assert "nvfp4-emulated" in err.value.fix
    hopper = hardware.GpuInfo(0, "NVIDIA H100", (9, 0), 80.0)
    monkeypatch.setattr(hardware, "gpus", lambda: [hopper])
    with pytest.raises(SolrlError, match="compute capability 9.0 < 10.0"):
        hardware.require_explore_precision("nvfp4", "cuda:0")


def test_fp8_is_accepted_on_hopper_and_offered_instead_of_nvfp4(monkeypatch):
    hopper = hardware.GpuInfo(0, "NVIDIA H100", (9, 0), 80.0)
    monkeypatch.setattr(hardware, "gpus", lambda: [hopper])
    monkeypatch.setattr(hardware, "te_support", lambda kind, gpu: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    hardware.require_explore_precision("fp8", "cuda:0")
    with pytest.raises(SolrlError) as err:
        hardware.require_explore_precision("nvfp4", "cuda:0")
    assert err.value.fix == "this machine supports: fp8, nvfp4-emulated, bf16, fp32; use --explore-precision fp8"
    b200 = hardware.GpuInfo(0, "NVIDIA B200", (10, 0), 180.0)
    monkeypatch.setattr(hardware, "gpus", lambda: [b200])
    monkeypatch.setattr(hardware, "te_support", lambda kind, gpu: (True, ""))
    with pytest.raises(SolrlError, match="not in this version") as err:
        hardware.require_explore_precision("nvfp4", "cuda:0")
    assert err.value.fix.startswith("use --explore-precision fp8 (real FP8 GEMMs) or nvfp4-emulated")
