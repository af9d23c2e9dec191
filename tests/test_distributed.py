"""Several processes on a CPU (gloo): a 2-rank run computes what a 1-rank run does, its checkpoint
resumes on 1 rank, an uneven split is a clear error, and rank 0 alone writes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.convert import from_dict, load_run_config
from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.loop.trainer import StopFlag, train
from tests.helpers import (DISTRIBUTED_SETS as SETS, logged_events as _events, saved_adapters as _adapters,
                           spawn as _spawn)


def _sets(root: Path, run: str, *extra: str) -> list[str]:
    return [*SETS, f"run.run_dir={root / run}", f"run.eval_prompts={root / 'eval.txt'}", *extra]


def _worker(rank: int, world: int, port: int, root: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    seen: list[ev.Event] = []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    session = train(resolve_config("tiny", "sol_rl", sets=_sets(root, "two", "run.iterations=2")), bus, stop=StopFlag())
    error = ""
    try:
        train(resolve_config("tiny", "sol_rl", sets=_sets(root, "bad", "run.prompts_per_iteration=3")), ev.EventBus(),
              stop=StopFlag())
    except SolrlError as exc:
        error = str(exc)
    report = {"rank": session.run.rank, "world": session.run.world_size, "events": len(seen), "error": error}
    (root / "results" / f"rank{rank}.json").write_text(json.dumps(report))


def _resume(run_dir: Path, iterations: int) -> list[ev.Event]:
    seen: list[ev.Event] = []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    cfg = from_dict({"run": {"iterations": iterations}}, load_run_config(run_dir), source="test").validate()
    train(cfg, bus, resume=True, stop=StopFlag())
    return seen


def test_two_ranks_equal_one_rank_and_resume_on_one(tmp_path):
    (tmp_path / "eval.txt").write_text("a red circle\n")
    (tmp_path / "results").mkdir()
    _spawn(2, tmp_path, worker=_worker)
    train(resolve_config("tiny", "sol_rl", sets=_sets(tmp_path, "one", "run.iterations=2")), ev.EventBus(),
          stop=StopFlag())
    one, two = tmp_path / "one", tmp_path / "two"

    # Rank 0 alone wrote and spoke: one event log line per event, the same files as one process.
    reports = [json.loads((tmp_path / "results" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in reports] == [(0, 2), (1, 2)]
    assert reports[0]["events"] > 0 and reports[1]["events"] == 0
    kinds = [e["event"] for e in _events(two)]
    assert kinds.count("run_started") == 1 and kinds.count("iteration") == 2 and kinds.count("run_finished") == 1
    assert kinds.count("eval") == 2 and kinds.count("checkpoint") == 1
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    assert "over 2 processes, 1 each" in _events(two)[0]["plan"]

    # The same rewards (Stage 1 and Stage 2, gathered over ranks), losses and evaluations.
    its = {name: [e for e in _events(d) if e["event"] == "iteration"] for name, d in (("one", one), ("two", two))}
    for a, b in zip(its["one"], its["two"]):
        for stage in ("draft", "final"):
            assert b[stage]["mean"] == pytest.approx(a[stage]["mean"], abs=1e-6)
            assert b[stage]["std"] == pytest.approx(a[stage]["std"], abs=1e-6)
        assert b["loss"]["loss"] == pytest.approx(a["loss"]["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    evals = [[e["mean"] for e in _events(d) if e["event"] == "eval"] for d in (one, two)]
    assert evals[1] == pytest.approx(evals[0], abs=1e-6)

    # The same adapters (trained, old, EMA) in the final checkpoint.
    a, b = _adapters(one, 2), _adapters(two, 2)
    assert a.keys() == b.keys()
    assert any(v.abs().max() > 0 for k, v in a.items() if "lora_B" in k)  # training moved them
    for k in a:  # only the gradient sum's order differs; Adam's step magnifies such rounding a little
        assert torch.allclose(a[k], b[k], atol=1e-5), k

    # A 2-rank checkpoint resumes on 1 rank, and goes on as the 1-rank run does.
    resumed = [e for e in _resume(two, 3) if isinstance(e, ev.IterationFinished)]
    straight = [e for e in _resume(one, 3) if isinstance(e, ev.IterationFinished)]
    assert [e.iteration for e in resumed] == [3]
    assert resumed[0].final.mean == pytest.approx(straight[0].final.mean, abs=1e-6)
    a, b = _adapters(one, 3), _adapters(two, 3)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)

    # 3 prompt groups on 2 processes: the same clear error on both ranks, and nothing written.
    for report in reports:
        assert "3 prompt groups do not split evenly over 2 processes" in report["error"]
        assert "run.prompts_per_iteration=2 or 4" in report["error"]
    assert not (tmp_path / "bad").exists()


def test_uneven_split_names_the_nearest_counts():
    from solrl_core.data.prompts import check_split

    with pytest.raises(SolrlError, match=r"48 prompt groups .* 5 processes.*prompts_per_iteration=45 or 50"):
        check_split(48, 5)
    with pytest.raises(SolrlError, match=r"prompts_per_iteration=4 \("):
        check_split(3, 4)
    check_split(48, 8)


def test_one_process_helpers_are_the_identity():
    from solrl_core.runtime import distributed

    assert "RANK" not in os.environ
    assert distributed.init_from_env() == (0, 1, 0) and not distributed.is_initialized()
    t = torch.arange(3.0)
    assert distributed.all_gather_tensor(t) is t and distributed.broadcast_object({"a": 1}) == {"a": 1}
    assert distributed.any_true(True) and not distributed.any_true(False)
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 3.0)
    distributed.all_reduce_mean_grads([p])
    assert torch.equal(p.grad, torch.full((2,), 3.0))


def test_launcher_reruns_train_under_torchrun_without_its_own_flags():
    from solrl_cli.launch import torchrun_args

    args = torchrun_args(2,
            argv=["train", "--nproc-per-node", "2", "--iterations", "3", "--nnodes=1", "--set", "run.seed=1"])
    assert args == ["--nproc-per-node", "2", "--nnodes", "1", "--standalone", "-m", "solrl_cli", "train",
                    "--iterations", "3", "--set", "run.seed=1"]
    multi = torchrun_args(8, 2, 1, "node0:29500", ["--iterations", "3"])
    assert multi[:8] == ["--nproc-per-node", "8", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "node0:29500"]
    with pytest.raises(SolrlError, match="rdzv-endpoint"):
        torchrun_args(8, 2, 1, None, [])


# ---------------------------------------------------------------- a launcher or a rank killed (real processes)


def _ranks_of(launcher: int) -> dict[int, int]:
    """RANK -> pid of the processes `launcher` started (torchrun's workers), from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rpartition(")")[2].split()[1]) == launcher:
                env = (stat.parent / "environ").read_bytes().split(b"\0")
                found.update({int(e.split(b"=", 1)[1]): int(stat.parent.name) for e in env if e.startswith(b"RANK=")})
        except (OSError, ValueError, IndexError):
            continue
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for a reaper that a container may not run)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _launch_two(tmp_path: Path, run_dir: Path):  # type: ignore[no-untyped-def]
    """`solrl train --nproc-per-node 2` (output in a file), once it is training past its first checkpoint:
    (the launcher, its ranks' pids, the output file)."""
    import subprocess
    import sys

    from solrl_core.io.rundir import list_checkpoints

    log = tmp_path / "out.txt"
    sets = [a for s in (*SETS, "run.checkpoint_every=1", "run.eval_prompts=") for a in ("--set", s)]
    with open(log, "w") as out:
        launcher = subprocess.Popen([sys.executable, "-m", "solrl_cli", "train", "--nproc-per-node", "2",
                                     "--iterations", "500",
                                     "--run-dir", str(run_dir), *sets], stdout=out, stderr=subprocess.STDOUT, text=True,
                                    env={**os.environ, "OMP_NUM_THREADS": "1", "SOLRL_DEBUG": "", "COLUMNS": "300"})
    deadline = time.monotonic() + 300
    while not list_checkpoints(run_dir) or len(_ranks_of(launcher.pid)) < 2:
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            pytest.fail(f"no checkpoint of the 2-process run:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return launcher, _ranks_of(launcher.pid), log


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc")
def test_ranks_whose_launcher_is_killed_stop_save_and_free_the_lock(tmp_path):
    import signal

    from solrl_core.engine.checkpoint import checkpoint_to_resume
    from solrl_core.faults.lock import RunLock
    from solrl_core.faults.manifest import verify
    from solrl_core.io.rundir import list_checkpoints

    run_dir = tmp_path / "run"
    launcher, ranks, log = _launch_two(tmp_path, run_dir)
    os.kill(launcher.pid, signal.SIGKILL)  # no clean-up runs in it, nothing is passed on to the ranks
    killed = time.monotonic()
    launcher.wait()
    while any(_running(p) for p in ranks.values()) and time.monotonic() - killed < 60:
        time.sleep(0.2)
    took = time.monotonic() - killed
    left = [p for p in ranks.values() if _running(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, (f"ranks {left} still running {took:.0f} s after their launcher was "
                      f"killed:\n{log.read_text()[-3000:]}")
    out = log.read_text()
    assert ("stop requested (the launcher died)" in out and "internal error" not in out
            and "stopped." not in out), out[-3000:]
    records = _events(run_dir)
    # as a stop does
    assert [e["reason"] for e in records if e["event"] == "run_finished"] == ["interrupted"], out[-3000:]
    done = max(e["iteration"] for e in records if e["event"] == "iteration")
    saved = list_checkpoints(run_dir)
    assert saved[-1].name in (f"iter_{done:06d}", f"iter_{done - 1:06d}")  # an abandoned iteration is redone on resume
    assert all(verify(p) is None for p in saved) and checkpoint_to_resume(run_dir) == saved[-1]
    RunLock.acquire(run_dir).release()  # what --resume takes first: free


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc")
def test_a_rank_killed_is_named_once_and_the_survivor_says_how_to_resume(tmp_path):
    import re
    import signal

    run_dir = tmp_path / "run"
    launcher, ranks, log = _launch_two(tmp_path, run_dir)
    os.kill(ranks[1], signal.SIGKILL)
    try:
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    out = log.read_text()
    assert launcher.returncode != 0
    assert "internal error" not in out and "Traceback" not in out and "Connection closed" not in out, out[-3000:]
    assert "error: rank 0 stopped: another process of this run died (the launcher's line names it)" in out, out[-3000:]
    assert f"`solrl train --resume {run_dir}` and the same launcher flags" in out
    named = [line for line in out.splitlines() if re.search(r"\brank 1\b.*(died|killed)", line)]
    assert len(named) == 1 and "was killed by signal SIGKILL" in named[0], out[-3000:]


def test_the_views_name_a_launcher_death_as_the_engine_does():
    from solrl_view.stop_text import LAUNCHER_SOURCE, stop_message
    from solrl_core.runtime import stopping

    assert LAUNCHER_SOURCE == stopping.LAUNCHER_SOURCE
    ack = ev.StopRequested(source=LAUNCHER_SOURCE, mode="phase", iteration=2, phase="explore", run_dir="/r",
                           checkpoint=None)
    assert "Ctrl-C or SIGTERM stops at once" in stop_message(ack)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads the node's processes from /proc")
def test_a_lost_peer_is_named_from_the_node_processes_under_torchrun_by_hand(monkeypatch, tmp_path):
    import subprocess

    from solrl_core.runtime import distributed

    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:27870. This is "
                        "typically caused by a remote worker crashing.")
    monkeypatch.setattr(distributed, "world_size", lambda: 3)
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    monkeypatch.setattr(os, "getppid", os.getpid)  # this process plays the launcher: its children are the node's ranks
    monkeypatch.delenv(distributed.LAUNCHER_ENV, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    peers = [subprocess.Popen(["sleep", "60"], env={**os.environ, "RANK": str(r)}) for r in (1, 2)]
    try:
        assert distributed.lost_peer(ValueError("Connection closed by peer")) is None  # not a collective's error
        assert distributed.lost_peer(RuntimeError("CUDA error: out of memory")) is None
        alive = distributed.lost_peer(gloo, tmp_path)
        assert alive is not None and "on another node died" in alive.message  # both local peers still run
        peers[1].kill()
        peers[1].wait()
        named = distributed.lost_peer(gloo, tmp_path)
        assert (named is not None and named.message == "rank 0 stopped: rank 2 of this run died; its connection closed "
                                                       "in a collective")
        assert f"`solrl train --resume {tmp_path}`" in named.fix and "gloo" not in named.message + named.fix
        monkeypatch.setenv(distributed.LAUNCHER_ENV, "1")  # under solrl's launcher, which names the rank itself
        assert "the launcher's line names it" in distributed.lost_peer(gloo, tmp_path).message
    finally:
        for p in peers:
            p.kill()
            p.wait()


def test_the_launcher_names_the_killed_rank_not_a_survivor_that_exited_in_the_same_second(capsys, tmp_path):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from solrl_cli.launch import _say_who_failed

    missing = str(tmp_path / "none.json")  # no error file: torchrun stamps each failure with the second it saw it
    for code in (2, -15):  # the survivor's own error line, or torchrun's SIGTERM while it exits
        survivor, killed = ProcessFailure(0, 101, code, missing), ProcessFailure(1, 102, -9, missing)
        killed.timestamp = survivor.timestamp
        _say_who_failed(ChildFailedError("solrl_cli", {0: survivor, 1: killed}), 1, "/r/x")
        err = capsys.readouterr().err
        assert "error: rank 1 (pid 102) was killed by signal SIGKILL" in err and "rank 0" not in err, err
    first, stopped = ProcessFailure(0, 101, 1, missing), ProcessFailure(1, 102, -15, missing)
    stopped.timestamp = first.timestamp
    _say_who_failed(ChildFailedError("solrl_cli", {0: first, 1: stopped}), 1, "/r/x")
    assert "error: rank 0 (pid 101) failed with exit code 1" in capsys.readouterr().err
