"""run.threads: what auto chooses from the cores this process may use and the processes on this
node, the explicit override, the OpenMP wait policy set before torch loads (and reaching libgomp
and torch in a process started as solrl starts), and the note on more processes than cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from solrl_core.runtime import threads
from solrl_core.runtime.threads import ThreadChoice, choose_threads, oversubscription, prepare_openmp, usable_cores

TWO_CORES = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2


def test_auto_takes_one_thread_per_usable_core_shared_by_the_node_processes():
    assert choose_threads(0, 2) == ThreadChoice(2, "auto: one per core this process may use, 2")
    assert choose_threads(0, 16, processes=4) == ThreadChoice(4, "auto: 16 cores shared by 4 processes on this node, 4 "
                                                                 "each")
    assert choose_threads(0, 7, processes=2).threads == 3
    assert choose_threads(0, 2, processes=4) == ThreadChoice(1, "auto: 2 cores shared by 4 processes on this node, at "
                                                                "least 1 each")


def test_a_number_is_used_as_given_and_oversubscription_is_named():
    assert choose_threads(1, 2) == ThreadChoice(1, "run.threads=1")
    assert choose_threads(2, 2) == ThreadChoice(2, "run.threads=2")
    assert choose_threads(3, 2) == ThreadChoice(3, "run.threads=3; more than the 2 cores this process may use")
    assert choose_threads(2, 4, processes=4).why == "run.threads=2; more than the 4 cores this process may use"


def test_auto_honours_the_users_omp_num_threads_only_in_a_single_process():
    assert choose_threads(0, 8, 1, "3") == ThreadChoice(3, "auto: OMP_NUM_THREADS=3")
    assert choose_threads(0, 8, 2, "1").threads == 4  # under torchrun the launcher set it, not the user
    assert choose_threads(0, 8, 1, "many").threads == 8
    assert choose_threads(0, 8, 1, "0").threads == 8
    assert choose_threads(5, 8, 1, "3").threads == 5  # run.threads wins


@pytest.mark.parametrize("files,affinity,expected", [
    ({}, {0, 1, 2}, 3),
    ({"cpu.max": "max 100000\n"}, {0, 1, 2}, 3),
    ({"cpu.max": "150000 100000\n"}, {0, 1, 2}, 2),  # 1.5 cores of quota: 2 threads, not 3
    ({"cpu.max": "50000 100000\n"}, {0, 1, 2, 3}, 1),
    ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, {0, 1, 2, 3, 4, 5}, 2),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, {0, 1, 2, 3, 4, 5}, 6),
    ({"cpu.max": "400000 100000\n"}, {5}, 1),  # the affinity allows one core whatever the quota
])
def test_usable_cores_are_the_affinity_capped_by_a_cgroup_quota(tmp_path, monkeypatch, files, affinity, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: affinity, raising=False)
    assert usable_cores(tmp_path) == expected


def test_the_wait_policy_is_set_only_before_torch_loads_and_never_over_the_users(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    env: dict[str, str] = {}
    assert prepare_openmp(env) is True and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for own in ({"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "300000"}):
        env = dict(own)
        assert prepare_openmp(env) is False and env == own
    monkeypatch.setitem(sys.modules, "torch", object())
    env = {}
    assert prepare_openmp(env) is False and env == {}  # too late: libgomp has read its variables


def test_the_start_up_line_names_threads_and_wait_policy():
    assert ThreadChoice(2, "run.threads=2").describe({"OMP_WAIT_POLICY": "PASSIVE"}) == \
        "torch threads 2 (run.threads=2); OMP_WAIT_POLICY=PASSIVE"
    assert ThreadChoice(1, "x").describe({"GOMP_SPINCOUNT": "300000"}) == "torch threads 1 (x); GOMP_SPINCOUNT=300000"
    assert ThreadChoice(1, "x").describe({}) == "torch threads 1 (x); libgomp's default wait: idle threads spin"


def test_more_processes_than_cores_on_a_cpu_is_one_line_of_arithmetic():
    assert oversubscription(2, 2) is None and oversubscription(1, 1) is None
    note = oversubscription(4, 2)
    assert note is not None and "\n" not in note
    assert "--nproc-per-node 4 on a CPU with 2 usable cores" in note and "0.5 of a core and 1 torch thread each" in note
    assert "at most 2 run at once: this exercises the distributed code, not speed" in note
    assert "0.33 of a core and 2 torch threads each" in oversubscription(3, 1, setting=2)


def test_a_cuda_run_gets_no_cpu_note():
    assert threads.launch_note(8, "cuda") is None and threads.launch_note(8, "cuda:1") is None


@pytest.mark.slow
@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_the_choice_reaches_torch_and_libgomp_in_a_fresh_process():
    """As `solrl` starts: the CLI module imports without torch, main's prepare_openmp runs, then a
    session applies run.threads. libgomp prints the wait policy it read (OMP_DISPLAY_ENV)."""
    code = ("import os, sys; os.sched_setaffinity(0, {0, 1}); import solrl_cli.app; "
            "assert 'torch' not in sys.modules, 'importing the CLI loaded torch before the wait policy is set'; "
            "from solrl_core.runtime.threads import prepare_openmp, apply_threads; prepare_openmp(); "
            "c = apply_threads(0); import torch; torch.ones(64, 64) @ torch.ones(64, 64); "
            "print('torch', torch.get_num_threads(), c.threads)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    # two processes on this node share the two cores: one thread each, where torch's default is two
    done = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_DISPLAY_ENV": "TRUE", "LOCAL_WORLD_SIZE": "2"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "torch 1 1" in done.stdout
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_solrl_train_reports_the_threads_torch_got(tmp_path, fast_sets):
    sets = [x for s in fast_sets("run.iterations=1", "run.eval_prompts=", "run.threads=0") for x in ("--set", s)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-m", "solrl_cli", "train", "--verbose", "--device", "cpu", *sets],
                          env={**env, "OMP_DISPLAY_ENV": "TRUE", "COLUMNS": "400"}, capture_output=True, text=True,
                          timeout=600, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "torch threads 1 (auto: one per core this process may use, 1); OMP_WAIT_POLICY=PASSIVE" in done.stdout
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in done.stderr


@pytest.mark.slow
def test_train_says_what_more_processes_than_cores_cost_before_launching(tmp_path, monkeypatch):
    """`solrl train --nproc-per-node N` on a CPU with fewer cores prints the note first; the uneven
    prompt split then stops it before torchrun starts anything."""
    from typer.testing import CliRunner

    from solrl_cli.app import app

    monkeypatch.chdir(tmp_path)
    nproc = usable_cores() + 1
    result = CliRunner().invoke(app, ["train", "--device", "cpu", "--nproc-per-node", str(nproc),
                                      "--set", f"run.prompts_per_iteration={nproc + 1}"], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert f"note: --nproc-per-node {nproc} on a CPU with {usable_cores()} usable core" in out
    assert f"at most {usable_cores()} run at once" in out
    assert out.index("note:") < out.index("do not split evenly")
