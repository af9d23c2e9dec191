"""A run folder from someone else is data: nothing in it is followed out of it (real symlinks), every
state value in its checkpoints is checked before use, and a damaged events line is one clear line
(docs/reliability.md, "Threats"). Each case drives a real `solrl` process on a copy of one tiny run."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_cli.tui.state import JsonlTail
from solrl_core.errors import SolrlError
from solrl_core.faults.manifest import verify, write_manifest
from solrl_core.faults.state_files import load_state, save_state
from solrl_core.io.atomic import write_atomic
from tests.helpers import (assert_refused as _refused, CKPT, copy_run as _copy, file_tree as _tree,
                           in_tmpfs as _in_tmpfs, record_events as _record, rewrite_state as _rewrite_state,
                           solrl_process as _solrl)
from tests.helpers import in_tmp, trained  # noqa: F401,F811  (fixtures, used by name)

DEEP = "[" * 10**6 + "]" * 10**6  # a line nested 10^6 deep


# ---------------------------------------------------------------- links out of the run folder


def test_a_lock_linked_out_of_the_run_is_refused_and_its_target_kept(in_tmp, trained):
    run = _copy(trained, in_tmp / "r")
    outside = in_tmp / "precious.txt"
    outside.write_text("the user's file\n")
    (run / "solrl.lock").unlink(missing_ok=True)
    (run / "solrl.lock").symlink_to(outside)
    _refused(_solrl(in_tmp, "train", "--resume", "r", "--iterations", "2"), "r/solrl.lock is a symbolic link",
             str(outside))
    assert outside.read_text() == "the user's file\n"


def test_an_events_log_linked_out_of_the_run_gets_nothing_appended(in_tmp, trained):
    run = _copy(trained, in_tmp / "r")
    outside = in_tmp / "script.sh"
    outside.write_text("echo hello\n")
    (run / "events.jsonl").unlink()
    (run / "events.jsonl").symlink_to(outside)
    _refused(_solrl(in_tmp, "train", "--resume", "r", "--iterations", "2"), "r/events.jsonl is a symbolic link")
    _refused(_solrl(in_tmp, "compare", "r", "--out", "cmp"), "r/events.jsonl is a symbolic link")  # not read either
    assert outside.read_text() == "echo hello\n"


def test_a_checkpoints_folder_linked_to_another_run_is_refused_and_that_run_kept(in_tmp, trained):
    mine, other = _copy(trained, in_tmp / "mine"), _copy(trained, in_tmp / "other")
    before = _tree(other)
    shutil.rmtree(mine / "checkpoints")
    (mine / "checkpoints").symlink_to(other / "checkpoints")
    _refused(_solrl(in_tmp, "train", "--resume", "mine", "--iterations", "3"), "mine/checkpoints is a symbolic link")
    assert _tree(other) == before  # no iteration folder of the other run deleted, renamed or added


def test_a_state_file_linked_out_of_its_checkpoint_is_refused(in_tmp, trained):
    run = _copy(trained, in_tmp / "r")
    folder = run.joinpath(*CKPT)
    outside = in_tmp / "state.json"
    outside.write_text((folder / "trainer_state.json").read_text())
    (folder / "trainer_state.json").unlink()
    (folder / "trainer_state.json").symlink_to(outside)
    write_manifest(folder)  # the manifest matches (its size and checksum are the target's): no defence
    problem = verify(folder)
    assert problem is not None and problem.file == "trainer_state.json" and "symbolic link" in problem.reason
    _refused(_solrl(in_tmp, "train", "--resume", "r", "--iterations", "2"), "trainer_state.json is a symbolic link")


def test_a_fifo_in_a_run_folder_is_refused(in_tmp, trained):
    run = _copy(trained, in_tmp / "r")
    (run / "solrl.lock").unlink(missing_ok=True)
    os.mkfifo(run / "solrl.lock")
    _refused(_solrl(in_tmp, "train", "--resume", "r", "--iterations", "2"), "r/solrl.lock is not a regular file or "
                                                                            "folder")


def test_an_atomic_write_never_follows_a_link_planted_under_its_temporary_name(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("kept")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".config.toml.tmp").symlink_to(outside)  # the temporary name write_atomic uses
    write_atomic(tmp_path / "run" / "config.toml", "x = 1\n")
    assert outside.read_text() == "kept" and (tmp_path / "run" / "config.toml").read_text() == "x = 1\n"


def test_a_link_that_stays_inside_the_run_folder_is_left_alone(tmp_path):
    from solrl_core.faults.links import check_tree

    (tmp_path / "run" / "checkpoints" / "iter_000001").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest").symlink_to("iter_000001")  # inside the folder: harmless
    check_tree(tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "out").symlink_to("../../elsewhere")  # relative, and out of the folder
    with pytest.raises(SolrlError, match="checkpoints/out is a symbolic link"):
        check_tree(tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "out").unlink()
    # W&B links its logs to its cache; solrl never reads wandb/
    (tmp_path / "run" / "wandb" / "logs").mkdir(parents=True)
    (tmp_path / "run" / "wandb" / "logs" / "debug-core.log").symlink_to(tmp_path / "cache.log")
    check_tree(tmp_path / "run")


# ---------------------------------------------------------------- hostile state values


def _no_iteration_ran(run: Path, events_before: str) -> None:
    assert (run / "events.jsonl").read_text() == events_before  # not even a run_started
    assert [p.name for p in (run / "checkpoints").iterdir()] == [CKPT[1]]


def test_a_huge_iteration_is_refused_before_any_iteration(in_tmp, trained):
    run = _copy(trained, in_tmp / "r")
    _rewrite_state(run.joinpath(*CKPT), iteration=10**4000)
    events = (run / "events.jsonl").read_text()
    _refused(_solrl(in_tmp, "train", "--resume", "r", "--iterations", "2"),
             '"iteration" is an integer of 4001 digits, the checkpoint\'s own number (1) expected')
    _no_iteration_ran(run, events)


def _resume_in_process(run: Path, expected: str) -> None:
    """The same CLI in this process (no second import of torch): the cases after the first of a kind."""
    events = (run / "events.jsonl").read_text()
    result = CliRunner().invoke(app, ["train", "--resume", run.name, "--iterations", "2"])
    assert result.exit_code == 2 and expected in result.output and "internal error" not in result.output, result.output
    _no_iteration_ran(run, events)


@pytest.mark.parametrize("value", [-5, "x"])
def test_an_iteration_that_is_negative_or_not_an_integer_is_refused(in_tmp, trained, value):
    run = _copy(trained, in_tmp / "r")
    _rewrite_state(run.joinpath(*CKPT), iteration=value)
    _resume_in_process(run, f'"iteration" is {value!r}, the checkpoint\'s own number (1) expected')


def test_an_optimizer_moment_of_the_wrong_shape_is_refused_before_an_iteration(in_tmp, trained):
    run = _copy(trained, in_tmp / "r")
    folder = run.joinpath(*CKPT)
    optimizer = load_state(folder, "optimizer")
    shape = list(optimizer["state"][0]["exp_avg"].shape)
    optimizer["state"][0]["exp_avg"] = torch.zeros(3)
    save_state(optimizer, folder, "optimizer")
    write_manifest(folder)
    _resume_in_process(run, f'optimizer.json is not a state solrl wrote: "state"[0].exp_avg is a torch.float32 tensor '
                            f'of '
                            f"shape [3], a torch.float32 tensor of shape {shape} expected")


# The CLI in a process that reports how much its peak memory grew past its imports (the checkpoint's
# tensors of the tiny model add a few MB; a "<U400000" array of numpy's 624-word key would add 1 GB).
MEASURED = ("import resource, runpy, sys\n"
            "import solrl_cli.app, solrl_core.loop.session, solrl_core.loop.trainer\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "sys.argv = ['solrl', *sys.argv[1:]]\n"
            "try:\n"
            "    runpy.run_module('solrl_cli', run_name='__main__')\n"
            "finally:\n"
            "    print('GREW_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, file=sys.stderr)\n")


def test_a_text_dtype_in_rng_json_is_refused_without_allocating(in_tmp, trained):
    run = _copy(trained, in_tmp / "r")
    folder = run.joinpath(*CKPT)
    text = (folder / "rng.json").read_text()
    assert text.count('"dtype": "<u4"') == 1  # numpy's key
    (folder / "rng.json").write_text(text.replace('"dtype": "<u4"', '"dtype": "<U400000"'))
    write_manifest(folder)
    events = (run / "events.jsonl").read_text()
    done = _solrl(in_tmp, "train", "--resume", "r", "--iterations", "2", code=MEASURED)
    _refused(done, "rng.json/.safetensors is unreadable or corrupt", "an array of dtype '<U400000': only numbers are "
                                                                     "stored")
    grew = int(done.stderr.rpartition("GREW_KB ")[2].split()[0])
    assert grew < 300 * 1024, f"peak memory grew {grew} KiB"  # far below the 1 GB the dtype asks for
    _no_iteration_ran(run, events)


# ---------------------------------------------------------------- export on a full disk, damaged events lines


def test_an_export_on_a_full_disk_leaves_nothing_and_runs_again(in_tmp, trained):
    run = _copy(trained, in_tmp / "r")
    mount = in_tmp / "small"
    export = f"{sys.executable} -m solrl_cli export {run} --out {mount}/out"
    # 200 KiB holds less than the LoRA file (430 KB); "freeing space" is growing the filesystem to 8 MiB
    done = _in_tmpfs(mount, f"{export}; echo RC=$?; ls -A {mount}; echo LISTED; mount -o remount,size=8m {mount} && "
                            f"{export}; echo RC2=$?; ls {mount}/out", size="200k")
    out = done.stdout + done.stderr
    first, _, second = done.stdout.partition("LISTED")
    assert ("RC=2" in first
            and "error: the disk is full: pytorch_lora_weights.safetensors could not be written" in out), out[-3000:]
    assert first.split("RC=2")[1].split() == [], f"the failed export left {first.split('RC=2')[1].split()}"
    assert "RC2=0" in second, out[-3000:]
    assert {"pytorch_lora_weights.safetensors", "adapter_model.safetensors", "README.md"} <= set(second.split())


def test_compare_names_a_line_nested_a_million_deep(tmp_path):
    _record(tmp_path / "r", "sol_rl", [0.5, 0.6], seconds=1.0)
    lines = (tmp_path / "r" / "events.jsonl").read_text().splitlines()
    (tmp_path / "r" / "events.jsonl").write_text("\n".join([*lines[:2], DEEP, *lines[2:]]) + "\n")
    # the line is skipped, named once; the run is still compared
    done = _solrl(tmp_path, "compare", "r", "--out", "cmp")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out and out.count("warning:") == 1, out[-3000:]
    assert ("r/events.jsonl line 3 skipped: damaged (nested too deep to be a record solrl wrote)" in out
            and "sed -i '3d'" in out)
    assert (tmp_path / "cmp" / "compare.csv").is_file()


def test_the_monitor_names_a_line_nested_a_million_deep(tmp_path):
    (tmp_path / "events.jsonl").write_text(DEEP + "\n")
    with pytest.raises(SolrlError, match="events.jsonl line 1: nested too deep to be a record solrl wrote"):
        JsonlTail(tmp_path / "events.jsonl").poll()


def test_a_kept_base_evaluation_nested_a_million_deep_is_a_warning(tmp_path):
    from solrl_core.loop.evaluation import BASE_FILE, RunEvals

    (tmp_path / BASE_FILE).write_text(DEEP)
    assert "eval_base.json cannot be read (RecursionError" in RunEvals(tmp_path, {}).restore()
