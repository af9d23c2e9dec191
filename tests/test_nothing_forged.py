"""Nothing lost, nothing forged (docs/reliability.md, "Threats"): export --overwrite keeps what solrl did
not write, a hard link or a folder swapped mid-run leads nowhere, stored verdicts and a kept base
evaluation are used only when the run's events bear them out, and no terminal control in a run folder
reaches the terminal. Each case drives a real `solrl` process on a copy of one tiny evaluated run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core.faults.manifest import write_manifest
from solrl_core.faults.state_files import load_state, save_state
from tests.conftest import FAST
from tests.helpers import (assert_refused as _refused, copy_run as _copy, ENV, file_tree as _tree,
                           rewrite_state as _rewrite_state, solrl_process as _solrl)
from tests.helpers import in_tmp  # noqa: F401,F811  (fixtures, used by name)

ITER = {n: ("checkpoints", f"iter_{n:06d}") for n in (1, 2, 3)}
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m"  # set the window title, clear the screen, an 8-bit CSI


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A three-iteration tiny run: the base evaluated, then iterations 2 (run.eval_every) and 3 (the last);
    a checkpoint at each iteration, iter_000001 never evaluated."""
    home = tmp_path_factory.mktemp("evaluated")
    sets = (*FAST, "sampler.eval_steps=2", "run.eval_every=2", "run.checkpoint_every=1", "run.keep_checkpoints=5")
    result = CliRunner().invoke(app, ["train", *[a for s in sets for a in ("--set", s)], "--iterations", "3",
                                      "--run-dir", str(home / "r")])
    assert result.exit_code == 0, result.output
    return home / "r"


def _out(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


# ---------------------------------------------------------------- export --overwrite, a killed export


def test_overwrite_replaces_only_what_an_export_wrote_and_a_clone_keeps_git_notes_and_samples(in_tmp, evaluated):
    run = _copy(evaluated, in_tmp / "r")
    assert _solrl(in_tmp, "export", "r", "--out", "clone").returncode == 0
    clone = in_tmp / "clone"  # what a git clone of a pushed export holds, and what its owner added
    (clone / ".git" / "objects").mkdir(parents=True)
    (clone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (clone / "NOTES.md").write_text("my notes\n")
    (clone / "samples").mkdir()
    (clone / "samples" / "a.png").write_bytes(b"png")
    mine = {k: v for k, v in _tree(clone).items() if k.startswith((".git", "NOTES", "samples"))}
    done = _solrl(in_tmp, "export", "r", "--out", "clone", "--weights", "trained", "--overwrite")
    assert done.returncode == 0, _out(done)[-3000:]
    assert {k: v for k, v in _tree(clone).items() if k.startswith((".git", "NOTES", "samples"))} == mine
    assert (clone / "NOTES.md").read_text() == "my notes\n" and "| weights | trained |" in (clone
                                                                                            / "README.md").read_text()
    said = _out(done).replace("\n", "")
    assert "--overwrite replaced the earlier export's 5 files (README.md, adapter_config.json" in said
    assert "every other file in clone is as it was" in said
    (clone / "adapter_config.json").unlink()  # a file of the new export where one of the user's stands: refused
    (clone / "NOTES.md").rename(clone / "adapter_config.json")
    record = json.loads((clone / "solrl_export.json").read_text())
    (clone
     / "solrl_export.json").write_text(json.dumps({"files": [f for f in record["files"] if f
                                                             != "adapter_config.json"]}))
    # in this process: the same code
    refused = CliRunner().invoke(app, ["export", "r", "--out", "clone", "--overwrite"])
    said = ("error: clone/adapter_config.json was not written by an earlier export: --overwrite would replace it")
    assert refused.exit_code == 2 and said in refused.output.replace("\n", " "), refused.output
    assert (clone / "adapter_config.json").read_text() == "my notes\n" and run.is_dir()


def test_a_killed_exports_partial_folder_is_removed_by_the_next_export_of_that_folder(in_tmp, evaluated):
    _copy(evaluated, in_tmp / "r")
    export = [sys.executable, "-m", "solrl_cli", "export", "r", "--out", "out"]
    proc = subprocess.Popen(export, cwd=in_tmp, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(in_tmp.glob(".out.*.partial")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.kill()  # kill -9 while it writes into its temporary folder
    proc.wait()
    left = list(in_tmp.glob(".out.*.partial"))
    if not left:  # it finished before the kill could land: leave what such a kill leaves
        shutil.rmtree(in_tmp / "out", ignore_errors=True)
        (in_tmp / ".out.k1ll3d.partial").mkdir()
        left = [in_tmp / ".out.k1ll3d.partial"]
    done = _solrl(in_tmp, "export", "r", "--out", "out")
    assert done.returncode == 0, _out(done)[-3000:]
    assert not list(in_tmp.glob(".out.*")), list(in_tmp.glob(".out.*"))
    assert f"removed {left[0].name}" in _out(done).replace(str(in_tmp) + "/", "")


# ---------------------------------------------------------------- hard links, a folder swapped mid-run


@pytest.mark.parametrize("name", ["solrl.lock", "events.jsonl"])
def test_a_hard_linked_lock_or_events_log_is_refused_and_the_other_file_kept(in_tmp, evaluated, name):
    run = _copy(evaluated, in_tmp / "r")
    outside = in_tmp / "precious.txt"
    outside.write_text("the user's file\n")
    (run / name).unlink(missing_ok=True)
    os.link(outside, run / name)  # O_NOFOLLOW does not see a hard link: one file, two names
    _refused(_solrl(in_tmp, "train", "--resume", "r", "--iterations", "4"), f"r/{name} is a hard link (2 names for one "
                                                                            f"file)")
    assert outside.read_text() == "the user's file\n"


SWAP = """import os, pathlib
RUN, OTHER, HOW = (os.environ[k] for k in ("SWAP_RUN", "SWAP_TO", "SWAP_HOW"))

def score(images, prompts):
    mine = pathlib.Path(RUN) / "checkpoints"
    if (mine / "iter_000001").is_dir() and not pathlib.Path(RUN, "swapped").exists():  # iteration 2, once
        os.rename(mine, pathlib.Path(RUN) / "checkpoints.mine")
        if HOW == "link":
            os.symlink(pathlib.Path(OTHER) / "checkpoints", mine)
        else:
            os.rename(pathlib.Path(OTHER) / "checkpoints", mine)
        pathlib.Path(RUN, "swapped").touch()
    return images.float().mean(dim=(1, 2, 3))
"""


@pytest.mark.parametrize("how", ["link", "folder"])
def test_a_checkpoints_folder_swapped_mid_run_is_refused_and_the_other_run_kept(in_tmp, evaluated, how):
    other = _copy(evaluated, in_tmp / "other")
    (in_tmp / "swap.py").write_text(SWAP)
    before = _tree(other / "checkpoints")
    sets = [a for s in (*FAST, "run.eval_prompts=", "run.checkpoint_every=1", "run.keep_checkpoints=1")
            for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "solrl_cli", "train", "--reward", "swap.py:score", *sets,
                           "--iterations", "3",
                           "--run-dir", "mine"], cwd=in_tmp, capture_output=True, text=True, timeout=300,
                          env={**ENV, "SWAP_RUN": str(in_tmp / "mine"), "SWAP_TO": str(other), "SWAP_HOW": how})
    assert (in_tmp / "mine" / "swapped").exists(), _out(done)[-3000:]
    _refused(done, "mine/checkpoints is a symbolic link" if how == "link" else
             "mine/checkpoints is no longer the folder this run opened")
    moved = other / "checkpoints" if how == "link" else in_tmp / "mine" / "checkpoints"
    assert _tree(moved) == before  # nothing of the other run's checkpoints written, renamed or deleted
    assert sorted(p.name for p in (in_tmp / "mine" / "checkpoints.mine").iterdir()) == ["iter_000001"]


# ---------------------------------------------------------------- verdicts and the kept base evaluation


def _verdict(run: Path, n: int, **values) -> None:
    folder = run.joinpath(*ITER[n])
    state = json.loads((folder / "trainer_state.json").read_text())
    kept = [e for e in state.get("evaluations", []) if e["iteration"] != n]
    _rewrite_state(folder, evaluations=[*kept, {"iteration": n, "gain": 9.9, "se": 0.01, "flagged": [], **values}])


def test_a_verdict_the_events_do_not_bear_out_is_not_used_by_best_nor_the_card(in_tmp, evaluated):
    run = _copy(evaluated, in_tmp / "r")
    _verdict(run, 1)  # iteration 1 was never evaluated (run.eval_every=2)
    _verdict(run, 2)  # evaluated, but its gain was not +9.9
    done = _solrl(in_tmp, "export", "r", "--best", "--out", "out")
    out = _out(done)
    assert done.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert out.count("warning:") == 2, out
    assert ("warning: iter_000001's trainer_state.json holds a verdict (+9.9000) that the run's events do not bear "
            "out: iteration 1 is not one the run evaluates (every 2 and each session's last); not "
            "used") in out.replace("\n", " ")
    assert "iter_000002's trainer_state.json holds a verdict (+9.9000)" in out.replace("\n", " ")
    assert "--best: iter_000003: the highest trained-reward gain" in out.replace("\n", " ")
    card = (in_tmp / "out" / "README.md").read_text()
    assert "iter_000003" in card and "9.9" not in card and "iter_000001" not in card


def test_a_gain_of_ten_to_the_4000_is_one_line_in_best_and_in_resume(in_tmp, evaluated):
    run = _copy(evaluated, in_tmp / "r")
    _verdict(run, 3, gain=10**4000)
    expected = 'is not a state solrl wrote: "evaluations"[2]'  # the base's, iteration 2's, the last's
    _refused(_solrl(in_tmp, "export", "r", "--best", "--out", "out"), expected)
    _refused(_solrl(in_tmp, "train", "--resume", "r", "--iterations", "4"), expected)


def test_a_forged_eval_base_is_scored_again_and_a_kept_one_says_when_it_was_written(in_tmp, evaluated):
    run = _copy(evaluated, in_tmp / "r")
    kept = _solrl(in_tmp, "eval", "r", "--out", "ev1")
    assert kept.returncode == 0, _out(kept)[-3000:]
    assert "base from r/eval_base.json, written 20" in _out(kept) and "digest ok" in _out(kept)
    base = json.loads((run / "eval_base.json").read_text())
    base["total"] = [min(1.0, v + 0.15) for v in base["total"]]  # a better-looking base: a smaller gain reported
    (run / "eval_base.json").write_text(json.dumps(base))
    forged = _solrl(in_tmp, "eval", "r", "--out", "ev2")
    out = _out(forged).replace("\n", " ")
    assert forged.returncode == 0, out[-3000:]
    assert "r/eval_base.json is not the base evaluation r's events.jsonl recorded writing (its digest differs): " \
           "the base is scored again" in out and "base from" not in out
    means = [json.loads((in_tmp / ev / "summary.json").read_text())["base"]["rewards"]["total"]["mean"]
             for ev in ("ev1", "ev2")]
    assert means[1] == pytest.approx(means[0], abs=1e-6)  # the true base, scored again


def test_an_optimizer_moment_of_another_dtype_is_refused_before_an_iteration(in_tmp, evaluated):
    run = _copy(evaluated, in_tmp / "r")
    folder = run.joinpath(*ITER[3])
    optimizer = load_state(folder, "optimizer")
    optimizer["state"][0]["exp_avg"] = optimizer["state"][0]["exp_avg"].to(torch.float64)
    save_state(optimizer, folder, "optimizer")
    write_manifest(folder)
    _refused(_solrl(in_tmp, "train", "--resume", "r", "--iterations", "4"),
             '"state"[0].exp_avg is a torch.float64 tensor of shape', "a torch.float32 tensor of shape")


# ---------------------------------------------------------------- terminal controls in a run folder


def test_no_terminal_control_in_a_run_folder_reaches_the_terminal(in_tmp, evaluated):
    """A foreign folder whose name and events hold escape sequences (a window title, a clear screen):
    train, eval, export, monitor and compare print them without the controls."""
    run = _copy(evaluated, in_tmp / f"r{HOSTILE}")
    with open(run / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"event": "warning", "time": time.time(), "message": f"look here{HOSTILE} now"}) + "\n")
    commands = {"monitor": ["monitor", run.name], "compare": ["compare", run.name, "--out", "cmp"],
                "export --best": ["export", run.name, "--best", "--out", "ex"],
                "eval": ["eval", run.name, "--out", "ev"],
                "train": ["train", "--resume", run.name, "--iterations", "4"]}
    said = {}
    for what, args in commands.items():
        done = _solrl(in_tmp, *args)
        said[what] = out = _out(done)
        assert done.returncode == 0 and "Traceback" not in out, f"{what}: {out[-3000:]}"
        assert not any(c in out for c in "\x1b\x07\x9b"), f"{what} printed a terminal control: {out[-2000:]!r}"
    assert "look here now" in said["monitor"]  # the sequences gone, what they enclosed too
    (in_tmp / f"e{HOSTILE}").mkdir()  # --best's error line names the folder
    refused = _solrl(in_tmp, "export", f"e{HOSTILE}", "--best")
    assert (refused.returncode == 2
            and "--best found no checkpoint of e that an evaluation passed" in _out(refused)), _out(refused)
    assert not any(c in _out(refused) for c in "\x1b\x07\x9b"), repr(_out(refused))


def test_the_tui_shows_a_run_folders_strings_without_their_controls(tmp_path):
    from solrl_cli.tui.state import RunState
    from solrl_core import events as ev

    state = RunState()
    state.apply(ev.RunWarning(message=f"live{HOSTILE}"))  # a live run's event, as the TUI gets it from the bus
    state.apply({"event": "warning", "time": 1.0, "message": f"logged{HOSTILE}"})  # a monitored run's, from its log
    assert state.warning_lines() and not any(c in line for line in state.warning_lines() for c in "\x1b\x07\x9b")
    assert [line.rpartition(" ")[2] for line in state.warning_lines()][-2:] == ["live", "logged"]


# ---------------------------------------------------------------- exit codes, the start-up limit


def test_an_automatic_stop_exits_3_not_ctrl_cs_130(in_tmp):
    (in_tmp / "ev.txt").write_text("a red circle\ntwo blue squares\na green triangle left of a yellow circle\n"
                                   "a red circle and a blue square\n")
    hack = ("optimizer.lr=3e-3", "run.eval_every=2", "run.eval_seeds=2", "sampler.eval_steps=3", "run.on_hacking=stop",
            f"run.eval_prompts={in_tmp / 'ev.txt'}")  # lr 3e-3 brightens the tiny world within 2 iterations
    sets = [a for s in (*FAST, *hack) for a in ("--set", s)]
    done = _solrl(in_tmp, "train", "--reward", "brightness", *sets, "--iterations", "4", "--run-dir", "r")
    out = _out(done)
    assert done.returncode == 3, out[-3000:]
    assert "reward hacking?" in out and "Traceback" not in out
    assert sorted(p.name for p in (in_tmp / "r" / "checkpoints").iterdir())[-1] == "iter_000002"


def test_reward_timeout_s_governs_start_up(tmp_path):
    from tests.serving import hostile, trickle

    sets = [a for s in (*FAST, "run.eval_prompts=", "reward.timeout_s=13") for a in ("--set", s)]
    with hostile(trickle) as url:
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "solrl_cli", "train", "--reward", f"remote:{url}", *sets,
                               "--iterations",
                               "1", "--run-dir", str(tmp_path / "r")], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env=ENV)
        seconds = time.monotonic() - t0
    assert done.returncode == 2 and f"reward server {url} did not answer within 13 s" in _out(done), _out(done)[-3000:]
    assert 13 <= seconds < 90, seconds  # the limit set, not the doctor's 10 s
