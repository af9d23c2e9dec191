"""benchmarks/explore_step.py runs end to end at tiny sizes on a CPU: every backend builds, steps
and refreshes through the explore copy's own wrappers. Nothing here checks a timing."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def explore_step(benchmark_module):
    return benchmark_module("explore_step")


def test_every_backend_steps_and_refreshes_at_tiny_size(explore_step, tmp_path, capsys):
    out = tmp_path / "step.json"
    explore_step.main(["--size", "tiny", "--device", "cpu", "--models", "sana", "flux", "--backends", "bf16", "fp8",
                       "nvfp4-emulated",
                       "--batch", "2", "--warmup", "1", "--repeats", "1", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    for model in ("sana", "flux"):
        steps = {r["backend"]: r for r in rows if r["model"] == model and "seconds" in r}
        assert set(steps) == {"bf16", "fp8", "nvfp4-emulated"}
        assert all(r["seconds"] > 0 for r in steps.values())
        assert steps["fp8"]["layers"].startswith("quantized ") and steps["bf16"]["layers"] == "bf16 weights and GEMMs"
        # The output check: bf16 against itself is exact; FP8 (8 bits) lands closer to it than NVFP4 (4 bits).
        assert steps["bf16"]["rel_error"] == 0.0
        assert 0.0 < steps["fp8"]["rel_error"] < steps["nvfp4-emulated"]["rel_error"] < 0.5
        refresh = {r["backend"] for r in rows if r["model"] == model and "refresh_seconds" in r}
        assert refresh == {"fp8", "nvfp4-emulated"}
    text = capsys.readouterr().out
    assert "speed-up over eager bf16" in text and "fp8 refresh" in text and "error vs bf16" in text


def test_one_command_lists_and_runs_every_backend_on_wan_too(explore_step, tmp_path, capsys):
    """A lease runs `--backends all` over SANA, FLUX.1 and Wan 2.1 1.3B (the default models); a backend
    this device cannot run is a row with its reason, never a crash or a silent gap."""
    from solrl_core.bench.explore import BACKENDS

    explore_step.main(["--list-backends"])
    assert capsys.readouterr().out.split() == list(BACKENDS) and {"fp8-torchao", "nvfp4"} <= set(BACKENDS)
    assert explore_step.PRESET == {"sana": "sana", "flux": "flux1", "wan": "wan21_t2v_1_3b"}
    pytest.importorskip("torchao")
    out = tmp_path / "wan.json"
    explore_step.main(["--size", "tiny", "--device", "cpu", "--models", "wan", "--backends", "fp8-torchao", "nvfp4",
                       "fp8+fp8-attention", "--batch", "2", "--warmup", "0", "--repeats", "1", "--json", str(out)])
    rows = {r["backend"]: r for r in json.loads(out.read_text())["rows"] if "refresh_seconds" not in r}
    assert {r["model"] for r in rows.values()} == {"wan"} and set(rows) == {"fp8-torchao", "nvfp4", "fp8+fp8-attention"}
    assert 0.0 < rows["fp8-torchao"]["rel_error"] < 0.05 and "(torchao)" in rows["fp8-torchao"]["layers"]
    assert rows["nvfp4"]["skipped"].startswith("no GPU: NVFP4 GEMMs need") and "seconds" not in rows["nvfp4"]
    attention = rows["fp8+fp8-attention"]  # FP8 FA3 only: the CPU emulation is no time worth a row
    assert attention["skipped"].startswith("no GPU: FP8 FA3 needs") and "seconds" not in attention


def test_real_sizes_on_a_cpu_are_refused(explore_step):
    with pytest.raises(SystemExit, match="real sizes need a GPU"):
        explore_step.main(["--device", "cpu"])


def test_device_auto_resolves_instead_of_reaching_torch_device(explore_step, tmp_path):
    """lease.py passes --device auto to every script; torch.device("auto") raised at once."""
    import torch

    out = tmp_path / "step.json"
    explore_step.main(["--size", "tiny", "--device", "auto", "--models", "sana", "--backends", "bf16", "--batch", "2",
                       "--warmup", "0", "--repeats", "1", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["args"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert any(r["backend"] == "bf16" and r["seconds"] > 0 for r in data["rows"])


def test_every_benchmark_that_picks_a_device_takes_auto():
    """One --device option for every script (benchmarks/_common.py's, auto included and resolved as run.device is)."""
    import re

    from tests.conftest import BENCHMARKS

    own = {p.name for p in BENCHMARKS.glob("*.py") if re.search(r"add_argument\(\s*['\"]--device['\"]", p.read_text())}
    assert own == {"_common.py"}
    takes = {p.name for p in BENCHMARKS.glob("*.py") if re.search(r"add_device_arg\(|add_common_args\(", p.read_text())}
    assert {"explore_step.py", "gpu_iteration.py", "lease.py", "families.py", "convergence.py"} <= takes


def test_compile_mode_reaches_the_compiled_blocks(explore_step, tmp_path, monkeypatch):
    """A lease compiles in mode `default`: max-autotune tuned each GEMM shape for 44-66 s on the H100."""
    from solrl_core.engine import regions

    modes = []

    def blocks(net, mode, **kwargs):  # the net as it is: this test is about the mode, not Inductor
        modes.append(mode)
        return net

    monkeypatch.setattr(regions, "CompiledBlocks", blocks)
    out = tmp_path / "step.json"
    explore_step.main(["--size", "tiny", "--device", "cpu", "--models", "sana", "--backends", "bf16", "--batch", "2",
                       "--warmup",
                       "0", "--repeats", "1", "--compile", "--compile-mode", "default", "--json", str(out)])
    assert modes == ["default"] and json.loads(out.read_text())["args"]["compile_mode"] == "default"


def test_the_json_is_written_after_each_backend(explore_step, tmp_path, monkeypatch):
    """A lease's time limit that stops the script in its second backend leaves the first one's step."""
    from solrl_core.bench import explore

    real, calls = explore._steps, []

    def stopped_at_the_second(m, backend, what):
        calls.append(backend)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a kill looks like from here: nothing after it runs
        return real(m, backend, what)

    monkeypatch.setattr(explore, "_steps", stopped_at_the_second)
    out = tmp_path / "step.json"
    with pytest.raises(KeyboardInterrupt):
        explore_step.main(["--size", "tiny", "--device", "cpu", "--models", "sana", "--backends", "bf16",
                           "nvfp4-emulated",
                           "--batch", "2", "--warmup", "0", "--repeats", "1", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["backend"] for r in rows] == ["bf16"] and rows[0]["seconds"] > 0
