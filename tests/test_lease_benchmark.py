"""benchmarks/lease.py, the one command a lent GPU runs first: end to end at tiny size on this CPU as
`python benchmarks/lease.py --size tiny --device auto` runs it (every step exits 0, lease.json says which
ran and passed), a step's time limit cuts it off without stopping the next, and the plan: FLUX.1 before
SANA, the limits of the steps that always start within the budget, a budget they overrun refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import BENCHMARKS


STEPS = ["probes", "flux1", "sana", "selftest", "pytest_gpu", "explore_step", "wan"]


@pytest.fixture
def lease(monkeypatch):
    # lease.py imports nothing heavy: not the benchmark_module fixture's diffusers
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("lease", None)
    import lease
    return lease


@pytest.mark.slow
def test_the_lease_runs_every_steps_code_at_tiny_size_and_says_which_ran_and_passed(tmp_path):
    """Every step's code path, as on the GPU, with --device auto passed on to every script: the probes,
    both benches, every self-test row this machine runs, the GPU test modules collected, explore_step."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "lease.py"), "--size", "tiny", "--device", "auto", "--out",
                           str(out),
                           "--budget", "1500"], capture_output=True, text=True, timeout=1600)
    report = json.loads((out / "lease.json").read_text())
    steps = {s["name"]: s for s in report["steps"]}
    logs = {name: (out / f"{name}.log").read_text()[-2000:] for name in steps if (out / f"{name}.log").exists()}
    assert done.returncode == 0, (done.stdout, logs)
    assert report["ran"] == report["passed"] == STEPS and list(steps) == STEPS
    assert report["device"] == "auto" and report["resolved_device"] in ("cpu", "cuda")
    assert all(s["passed"] and not s["timed_out"] for s in steps.values())
    for name in ("probes", "selftest", "flux1", "sana", "explore_step", "wan"):
        assert steps[name]["written"] == [f"{name}.json"] and json.loads((out / f"{name}.json").read_text())
    assert all(s["command"][s["command"].index("--device") + 1] == "auto" for s in steps.values()
               if "--device" in s["command"])
    probes = {p["name"]: p["status"] for p in json.loads((out / "probes.json").read_text())["probes"]}
    assert list(probes) == ["e5m2_x_e5m2", "fp8_rowwise", "torchao_float8", "torchao_nvfp4", "fa3_fp8_attention",
                            "transformer_engine", "torchao_float8_compiled"]
    assert set(probes.values()) <= {"ran", "skipped", "raised"}
    rows = {r["name"]: r["status"] for r in json.loads((out / "selftest.json").read_text())}
    assert "fail" not in rows.values() and rows["reward-server"] == rows["explore/fp8-e5m2-delayed"] == "pass"
    assert sum(status == "pass" for status in rows.values()) >= 17  # every row a CPU runs (tests/test_selftest.py)
    assert "2 skipped" in logs["pytest_gpu"] or "passed" in logs["pytest_gpu"]  # the GPU tests collected
    flux = json.loads((out / "flux1.json").read_text())
    assert flux["model"]["vae"] == "published" and flux["rows"][0]["compile_mode"] == "default"
    assert "run.tf32=true" in steps["sana"]["command"]


def test_a_step_past_its_limit_is_killed_and_recorded_and_the_lease_moves_on(tmp_path, monkeypatch, lease):
    slow = lease.Step("slow", [sys.executable, "-c", "import time; time.sleep(60)"], 1)
    quick = lease.Step("quick", [sys.executable, "-c", "print('ok')"], 30)
    monkeypatch.setattr(lease, "steps", lambda *a: [slow, quick])
    assert lease.main(["--out", str(tmp_path), "--budget", "120"]) == 1
    report = json.loads((tmp_path / "lease.json").read_text())
    assert [(s["name"], s["timed_out"], s["rc"] == 0)
            for s in report["steps"]] == [("slow", True, False), ("quick", False, True)]
    assert report["ran"] == ["slow", "quick"] and report["passed"] == ["quick"]
    assert (tmp_path / "quick.log").read_text().strip() == "ok"


@pytest.mark.parametrize("gpu", ["h100", "h200", "b200"])
def test_the_plan_fits_the_budget_flux_first_and_no_step_can_run_past_it(lease, gpu, tmp_path):
    big = gpu != "h100"
    chosen = lease.steps("real", "auto", tmp_path, big)
    names = [s.name for s in chosen]
    assert names == STEPS and names.index("flux1") < names.index("sana")
    reserved = [s for s in chosen if s.needs_s is None]
    assert [s.name for s in reserved] == ["probes", "flux1"]
    assert sum(s.limit_s for s in reserved) <= 540 and lease.refuse_over_budget(chosen, 540) == ""
    rows = lease.planned(chosen, 540, lease.estimates_for(gpu))
    assert sum(r["expected_s"] for r in rows) <= 540
    for step, row in zip(chosen, rows):
        assert row["expected_start_s"] + (row["expected_s"] if row["expected_to_start"] else 0) <= 540
        if step.needs_s is not None and row["expected_to_start"]:
            assert row["expected_s"] <= min(step.limit_s, 540 - row["expected_start_s"])
    flux = next(r for r in rows if r["name"] == "flux1")
    assert flux["estimated"] and flux["expected_s"] <= flux["limit_s"]  # the estimate fits its limit
    command = next(s for s in chosen if s.name == "flux1").command
    assert command[command.index("--n") + 1] == ("96" if big else "24") and "--compile-mode" in command
    assert command[command.index("--compile-mode") + 1] == "default" and command[command.index("--iterations")
                                                                                 + 1] == "2"
    for name in ("sana", "wan", "explore_step"):  # no GEMM autotuning in a lease: 44-66 s a shape on the H100
        sets = next(s for s in chosen if s.name == name).command
        assert sets[sets.index("--compile-mode") + 1] == "default"
    assert "run.compile_mode=default" in next(s for s in chosen if s.name == "selftest").command


def test_plan_prints_every_step_and_refuses_a_budget_the_first_steps_overrun():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "lease.py"), "--plan", "--gpu", "h200"],
                          capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "ESTIMATES" in lines[0] and "not a measurement" in lines[0]
    order = [line.split()[0] for line in lines[2:-1]]
    assert order == STEPS
    assert lines[-1].startswith("total: 455 s of limits") and "within --budget 540 s" in lines[-1]
    refused = subprocess.run([sys.executable, str(BENCHMARKS / "lease.py"), "--plan", "--gpu", "h200", "--budget",
                              "400"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == ("lease: refused: the steps that always start need probes 75 + flux1 380 = 455 s, "
                                      "over --budget 400 s: raise --budget or lower their limits")


def test_a_probe_that_raises_is_an_answer_and_one_whose_own_code_breaks_is_a_failure(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("cuda_probes", None)
    import cuda_probes

    def raised(cls: str, message: str = "x") -> dict:
        return {"name": cls, "status": "raised", "exception": {"class": cls, "message": message}}

    records = [raised("ValueError"), raised("RuntimeError"), raised("NameError"), raised("AttributeError"),
               raised("ModuleNotFoundError", "No module named 'solrl_core.nope'"),
               raised("ModuleNotFoundError", "No module named 'torchao'"),
               {"name": "late", "status": "timed out"}, {"name": "ok", "status": "ran", "result": {}}]
    assert cuda_probes.failed(records) == ["NameError", "AttributeError", "ModuleNotFoundError", "late"]
    assert cuda_probes.run_one("transformer_engine", "cpu")["status"] == "ran"


def test_pyproject_allows_only_plotext_versions_textual_plotext_accepts():
    """A plotext the TUI's plotting library refuses (6.x) left five test modules unimportable on a GPU machine."""
    import tomllib
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    deps = [Requirement(d)
            for d in tomllib.loads((BENCHMARKS.parent / "pyproject.toml").read_text())["project"]["dependencies"]]
    ours = next((d for d in deps if d.name == "plotext"), None)
    theirs = next(Requirement(r) for r in requires("textual-plotext") or [] if Requirement(r).name == "plotext")
    assert ours is not None, "pyproject.toml leaves plotext to whatever textual-plotext's resolver picks"
    for version in ("5.2.8", "5.3.2", "6.0.0", "6.1.0", "7.0.0"):
        assert version not in ours.specifier or version in theirs.specifier, version
    assert "5.3.2" in ours.specifier
