"""benchmarks/lease.py, the one command a lent GPU runs first, end to end at tiny size on this CPU as
`python benchmarks/lease.py --size tiny --device cpu` would run it: every step exits 0, lease.json is
rewritten after each, and a step's time limit cuts it off without stopping the next."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import BENCHMARKS


@pytest.mark.slow
def test_the_lease_runs_every_step_at_tiny_size_and_writes_json_as_it_goes(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "lease.py"), "--size", "tiny", "--device", "cpu", "--out", str(out),
                           "--budget", "1500"], capture_output=True, text=True, timeout=1600)
    report = json.loads((out / "lease.json").read_text())
    steps = {s["name"]: s for s in report["steps"]}
    logs = {name: (out / f"{name}.log").read_text()[-2000:] for name in steps if (out / f"{name}.log").exists()}
    assert done.returncode == 0, (done.stdout, logs)
    assert list(steps) == ["selftest", "pytest_gpu", "flux1", "sana", "explore_step", "wan"]
    assert all(s["rc"] == 0 and not s["timed_out"] for s in steps.values())
    for name in ("selftest", "flux1", "sana", "explore_step", "wan"):
        assert steps[name]["written"] == [f"{name}.json"] and json.loads((out / f"{name}.json").read_text())
    rows = {r["name"]: r["status"] for r in json.loads((out / "selftest.json").read_text())}
    assert rows == {"model/sana": "pass", "reward-server": "pass"}
    assert json.loads((out / "flux1.json").read_text())["model"]["vae"] == "published"
    assert "--compile-mode" in steps["flux1"]["command"] and "run.tf32=true" in steps["sana"]["command"]


def test_a_step_past_its_limit_is_killed_and_recorded_and_the_lease_moves_on(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # lease.py imports nothing heavy: not the benchmark_module fixture's diffusers
    sys.modules.pop("lease", None)
    import lease
    slow = lease.Step("slow", [sys.executable, "-c", "import time; time.sleep(60)"], 1)
    quick = lease.Step("quick", [sys.executable, "-c", "print('ok')"], 30)
    monkeypatch.setattr(lease, "steps", lambda *a: [slow, quick])
    assert lease.main(["--out", str(tmp_path), "--budget", "120"]) == 1
    report = json.loads((tmp_path / "lease.json").read_text())
    assert [(s["name"], s["timed_out"], s["rc"] == 0) for s in report["steps"]] == [("slow", True, False), ("quick", False, True)]
    assert (tmp_path / "quick.log").read_text().strip() == "ok"


def test_pyproject_allows_only_plotext_versions_textual_plotext_accepts():
    """A plotext the TUI's plotting library refuses (6.x) left five test modules unimportable on a GPU machine."""
    import tomllib
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    deps = [Requirement(d) for d in tomllib.loads((BENCHMARKS.parent / "pyproject.toml").read_text())["project"]["dependencies"]]
    ours = next((d for d in deps if d.name == "plotext"), None)
    theirs = next(Requirement(r) for r in requires("textual-plotext") or [] if Requirement(r).name == "plotext")
    assert ours is not None, "pyproject.toml leaves plotext to whatever textual-plotext's resolver picks"
    for version in ("5.2.8", "5.3.2", "6.0.0", "6.1.0", "7.0.0"):
        assert version not in ours.specifier or version in theirs.specifier, version
    assert "5.3.2" in ours.specifier
