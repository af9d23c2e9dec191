"""Every check that needs no model runs before any model loads (before torch is imported, so in about a
second): a file where a run folder is expected, an empty prompt or one with a word the tiny model does not
know, a checkpoint the run does not hold, an export folder that exists. Each drives a real solrl process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The CLI in a process of its own, saying at the end whether torch was imported on the way to its answer.
_PROBE = """
import sys
from solrl_cli.app import main
sys.argv = ["solrl", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    print("EXIT", exc.code)
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""


def solrl(cwd: Path, *args: str, probe: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("SOLRL_DEBUG", None)
    head = ["-c", _PROBE] if probe else ["-m", "solrl_cli"]
    return subprocess.run([sys.executable, *head, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    """A run folder as `solrl train` leaves it, as far as the checks read it: its config and one
    complete checkpoint (a manifest over its files)."""
    from solrl_core.config.convert import save_run_config
    from solrl_core.config.presets import resolve_config
    from solrl_core.faults.manifest import write_manifest

    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "iter_000001"
    checkpoint.mkdir(parents=True)
    save_run_config(run, resolve_config("tiny", "sol_rl", sets=[f"run.run_dir={run}"]))
    (checkpoint / "trainer_state.json").write_text("{}")
    write_manifest(checkpoint)
    return run


@pytest.mark.parametrize("args", [
    ["train", "--run-dir", "afile", "--iterations", "1"], ["train", "--resume", "afile"], ["eval", "afile"],
    ["infer", "afile", "--prompt", "a red circle"], ["export", "afile"], ["monitor", "afile"], ["compare", "afile"],
])
def test_a_file_where_a_run_folder_is_expected_is_named_as_such(tmp_path, args):
    (tmp_path / "afile").write_text("notes\n")
    proc = solrl(tmp_path, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: afile is a file, not a run folder" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args,message", [
    (["infer", "{run}", "--prompt", ""], "--prompt is empty"),
    (["infer", "{run}", "--prompt", "a red dog"], "the model does not know the word 'dog'"),
    (["export", "{run}", "--checkpoint", "iter_999"], "no checkpoint 'iter_999' in"),
    (["train", "--resume", "{run}", "--checkpoint", "iter_999999"], "no checkpoint 'iter_999999' in"),
    (["export", "{run}"], "export/iter_000001-ema exists and is not empty"),
])
def test_a_mistake_that_needs_no_model_is_said_before_torch_loads(run_folder, args, message):
    (run_folder / "export" / "iter_000001-ema").mkdir(parents=True)
    (run_folder / "export" / "iter_000001-ema" / "notes.txt").write_text("mine\n")
    proc = solrl(run_folder.parent, *[a.format(run=run_folder) for a in args], probe=True)
    out = proc.stdout + proc.stderr
    assert message in out and "EXIT 2" in out, out
    assert proc.stdout.strip().splitlines()[-1] == "NO-TORCH", out  # nothing of a model loaded: seconds, not 20-45 s
