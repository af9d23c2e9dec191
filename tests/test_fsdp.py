"""distributed.strategy=fsdp on a CPU (gloo): a 2-rank sharded run trains what a 1-rank run does,
checkpoints cross strategies and world sizes both ways, settings that need a full-precision copy are
refused, and the per-GPU memory estimate of each strategy (the low-precision explore copy under fsdp:
tests/test_fsdp_explore.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.convert import from_dict, load_run_config, set_value
from solrl_core.config.presets import resolve_config
from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError
from solrl_core.faults.state_files import load_state
from solrl_core.loop.trainer import StopFlag, train
from tests.helpers import (assert_adapters_close as _close, FSDP_SETS as SETS, logged_events as _events, run_two_nodes,
                           saved_adapters as _adapters, spawn as _spawn)


def _config(root: Path, run: str, strategy: str, iterations: int) -> Config:
    return resolve_config("tiny", "sol_rl",
                          sets=[*SETS, f"run.run_dir={root / run}", f"run.eval_prompts={root / 'eval.txt'}",
                                                  f"run.iterations={iterations}", f"distributed.strategy={strategy}"])


def _resume(run_dir: Path, strategy: str, iterations: int) -> None:
    cfg = from_dict({"run": {"iterations": iterations, "run_dir": str(run_dir)}, "distributed": {"strategy": strategy}},
                    load_run_config(run_dir), source="test").validate()
    train(cfg, ev.EventBus(), resume=True, stop=StopFlag())


def _worker(rank: int, world: int, port: int, root: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    session = train(_config(root, "two", "fsdp", 3), ev.EventBus(), stop=StopFlag())
    report = {"sharded": session.run.sharded, "plan": session.run.layout.describe()}
    _resume(root / "one_then_fsdp", "fsdp", 4)  # a 1-process replicated checkpoint, resumed sharded
    (root / "results" / f"rank{rank}.json").write_text(json.dumps(report))


def test_two_sharded_ranks_train_what_one_process_does_and_checkpoints_cross_both_ways(tmp_path):
    (tmp_path / "eval.txt").write_text("a red circle\n")
    (tmp_path / "results").mkdir()
    train(_config(tmp_path, "one", "replicate", 3), ev.EventBus(), stop=StopFlag())
    one, two, crossed = tmp_path / "one", tmp_path / "two", tmp_path / "one_then_fsdp"
    shutil.copytree(one, crossed)
    _spawn(2, tmp_path, worker=_worker)

    reports = [json.loads((tmp_path / "results" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["sharded"] for r in reports)
    started = _events(two)[0]
    assert "fsdp over 2 processes (mesh shard 2; as configured)" in started["plan"]
    assert "explore fp32 (Stage 1 at the run dtype on the policy's old adapter)" in started["machine"]

    # The same rewards, losses and evaluations, iteration by iteration, and the same adapters (trained,
    # old, EMA) in the checkpoint rank 0 wrote from the gathered shards.
    its = [[e for e in _events(d) if e["event"] == "iteration"] for d in (one, two)]
    assert len(its[1]) == 3
    for a, b in zip(*its):
        assert b["final"]["mean"] == pytest.approx(a["final"]["mean"], abs=1e-6)
        assert b["loss"]["loss"] == pytest.approx(a["loss"]["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    evals = [[e["mean"] for e in _events(d) if e["event"] == "eval"] for d in (one, two)]
    assert len(evals[1]) == 2 and evals[1] == pytest.approx(evals[0], abs=1e-6)
    reference = _adapters(one, 3)
    assert any(v.abs().max() > 0 for k, v in reference.items() if "lora_B" in k)  # training moved them
    _close(reference, _adapters(two, 3))

    # The sharded checkpoint resumes on one replicated process, the replicated one on two sharded
    # ranks, and both go on as the 1-process run does (adapters and AdamW state alike).
    _resume(two, "replicate", 4)
    _resume(one, "replicate", 4)
    reference = _adapters(one, 4)
    _close(reference, _adapters(two, 4))
    _close(reference, _adapters(crossed, 4))
    moments = [load_state(d / "checkpoints" / "iter_000004", "optimizer")["state"]
               for d in (one, two, crossed)]
    for other in moments[1:]:
        assert other.keys() == moments[0].keys()
        for i in moments[0]:
            assert torch.allclose(other[i]["exp_avg_sq"], moments[0][i]["exp_avg_sq"], rtol=1e-3, atol=1e-12)


def _uneven_worker(rank: int, world: int, port: int, root: Path) -> None:
    """Both strategies, 2 iterations each, where rank 1 drops 2 of its 4 final samples in iteration 1
    (their reward is NaN): then it has fewer micro-batches than rank 0."""
    import solrl_core.loop.stages as stages
    from solrl_core.rewards.tinyworld import TinyWorldReward

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    real_call, real_update, calls, sizes = TinyWorldReward.__call__, stages.update, [], []

    def call(self, images, prompts):  # type: ignore[no-untyped-def]
        out = real_call(self, images, prompts).clone()
        calls.append(len(prompts))
        if rank == 1 and calls.count(4) == 1 and len(prompts) == 4:  # iteration 1's final samples (K=4 of one group)
            out[:2] = float("nan")
        return out

    def update(run, batch, *args, **kwargs):  # type: ignore[no-untyped-def]
        sizes.append(len(batch.prompts))
        return real_update(run, batch, *args, **kwargs)

    TinyWorldReward.__call__, stages.update = call, update
    for name, strategy in (("rep", "replicate"), ("shd", "fsdp")):
        calls.clear()
        cfg = resolve_config("tiny", "sol_rl", sets=[*SETS, "optimizer.micro_batch=2", "run.iterations=2",
                                                     f"run.run_dir={root / name}", f"distributed.strategy={strategy}",
                                                     "run.eval_prompts="])  # no evaluation batch of 4 to mistake
        train(cfg, ev.EventBus(), stop=StopFlag())
    (root / "results" / f"rank{rank}.json").write_text(json.dumps(sizes))


@pytest.mark.slow
def test_a_rank_with_fewer_usable_samples_joins_the_others_collectives_and_steps_as_a_replica(tmp_path):
    (tmp_path / "results").mkdir()
    _spawn(2, tmp_path, worker=_uneven_worker)  # a hang (a rank in a collective the other never joins) fails
    sizes = [json.loads((tmp_path / "results" / f"rank{r}.json").read_text()) for r in range(2)]
    assert sizes == [[4, 4, 4, 4], [2, 4, 2, 4]]  # per update: replicate's 2 iterations, then fsdp's
    _close(_adapters(tmp_path / "rep", 2), _adapters(tmp_path / "shd", 2))

def _machine(cfg: Config):  # type: ignore[no-untyped-def]
    from solrl_core.plan.resolve import resolve_machine

    return resolve_machine(cfg, torch.device("cpu"), "fp32")


def test_fsdp_keeps_a_whole_explore_copy_a_sharded_rollout_copy_when_asked_and_refuses_what_it_cannot_run():
    from solrl_core.plan.fsdp import fsdp_machine

    cfg = resolve_config("tiny", "sol_rl")
    machine = _machine(cfg)
    assert machine.explore_precision == "nvfp4-emulated"  # a replica on a CPU explores on an emulated NVFP4 copy
    sharded = fsdp_machine(machine, cfg, "fp32")
    assert (sharded.explore_precision, sharded.rollout_copy, sharded.update_compile) == ("nvfp4-emulated", False, False)
    assert "under fsdp a whole nvfp4-emulated copy on each process" in sharded.describe()
    for setting in ("explore.precision=fp8-e5m2-tensor", "explore.rank_check_every=2"):  # refused before this version
        ok = set_value(cfg, setting)
        assert fsdp_machine(_machine(ok), ok, "fp32").explore_precision == ok.explore.precision.replace("auto",
                "nvfp4-emulated")
    naive_quant = resolve_config("tiny", "naive_quant")
    assert fsdp_machine(_machine(naive_quant), naive_quant, "fp32").explore_precision == "nvfp4-emulated"
    at_dtype = set_value(cfg, "explore.precision=fp32")
    assert "Stage 1 at the run dtype" in fsdp_machine(_machine(at_dtype), at_dtype, "fp32").explore_why
    kept = set_value(cfg, "sampler.rollout_copy=true")  # refused before this version: now sharded like the policy
    full = fsdp_machine(_machine(kept), kept, "fp32", shard=2)
    assert (full.rollout_copy, full.rollout_compile) == (True, False)
    assert "under fsdp sharded like the policy, 1/2 on each process" in full.rollout_copy_why
    assert "auto under fsdp keeps none" in sharded.rollout_copy_why
    refused = {"optimizer.compile=true": "optimizer.compile",
               "explore.calibrate=steps": "explore.calibrate measures on one process",
               "sampler.rollout_copy=true sampler.compile=true":
                   "sampler.compile=true compiles the rollout copy, which",
               "distributed.copy_layout=sharded explore.compile=true": "explore.compile=true compiles the explore copy"}
    for settings, words in refused.items():
        bad = cfg
        for setting in settings.split():
            bad = set_value(bad, setting)
        with pytest.raises(SolrlError, match=words):
            fsdp_machine(_machine(bad), bad, "fp32", shard=2)
    bad = resolve_config("tiny", "compile")
    with pytest.raises(SolrlError, match="the compile family rolls out on a compiled full-precision copy"):
        fsdp_machine(_machine(bad), bad, "fp32")
    with pytest.raises(SolrlError, match="unknown distributed.strategy 'fdsp'"):
        set_value(cfg, "distributed.strategy=fdsp").validate()


def test_auto_shards_only_what_does_not_fit_one_gpu_and_only_over_several_processes():
    from solrl_core.plan.fsdp import resolve_strategy
    from solrl_core.precision.hardware import GpuInfo

    h100 = GpuInfo(0, "H100", (9, 0), 79.1)
    qwen, sana = resolve_config("qwen_image", "sol_rl", "imagereward"), resolve_config("sana", "sol_rl", "imagereward")
    fp8 = dataclasses.replace(_machine(qwen), explore_precision="fp8")  # what auto resolves on an H100
    assert resolve_strategy(qwen, fp8, "bf16", h100, 8)[0] == "fsdp"  # 20B with an fp8 explore copy: over 80 GB
    assert resolve_strategy(sana, fp8, "bf16", h100, 8)[0] == "replicate"
    assert resolve_strategy(qwen, fp8, "bf16", h100, 1) == ("replicate", "auto with one process: nothing to shard over")
    assert resolve_strategy(qwen, fp8, "bf16", None, 8)[0] == "replicate"  # a CPU
    forced = set_value(sana, "distributed.strategy=fsdp")
    assert resolve_strategy(forced, fp8, "bf16", h100, 8) == ("fsdp", "as configured")


def test_the_sharded_estimate_divides_the_weights_and_adds_the_gathered_blocks():
    from solrl_core.plan.footprint import estimate_memory
    from solrl_core.plan.fsdp import GATHERED_SHARE, sharded_estimate

    cfg = resolve_config("qwen_image", "sol_rl", "imagereward")
    whole = estimate_memory(cfg, "bf16", "bf16", True, rollout_copy=False)  # no explore copy: what fsdp runs
    assert sharded_estimate(cfg, "bf16", 1) == whole
    eight = sharded_estimate(cfg, "bf16", 8)
    assert eight.policy == pytest.approx(whole.policy / 8 + whole.policy * GATHERED_SHARE)
    assert eight.explore_copy == 0 and eight.rollout_copy == 0
    assert eight.peak - eight.policy == pytest.approx(whole.peak - whole.policy)
    # exploring at fp8: a whole copy on each process, its quantized cache alone (1 byte a weight)
    fp8 = sharded_estimate(cfg, "bf16", 8, explore_precision="fp8")
    assert fp8.explore_copy == pytest.approx(20.4e9 / 2**30) and fp8.peak == pytest.approx(eight.peak
                                                                                           + fp8.explore_copy)
    emulated = sharded_estimate(cfg, "bf16", 8, explore_precision="nvfp4-emulated")
    assert emulated.explore_copy == pytest.approx(2 * fp8.explore_copy)  # its fake-quantized weights at bf16
    # one process: a replica's copy, lean the same way (engine._copy)
    assert sharded_estimate(cfg, "bf16", 1, explore_precision="fp8").explore_copy == pytest.approx(fp8.explore_copy)


def test_the_doctor_names_the_strategy_and_process_count_that_fit():
    from solrl_core.doctor.strategy import backend_check, strategy_check
    from solrl_core.precision.hardware import GpuInfo

    qwen = resolve_config("qwen_image", "sol_rl", "imagereward")
    check = strategy_check(qwen, GpuInfo(0, "H100", (9, 0), 79.1), 1)
    assert check.status == "warn" and "replicate 74.2 GiB" in check.detail and "fsdp over 8 44.8 GiB" in check.detail
    assert "--set distributed.strategy=fsdp --nproc-per-node 2" in check.fix
    assert strategy_check(qwen, GpuInfo(0, "H200", (9, 0), 139.7), 1).status == "pass"
    assert backend_check(1, None) is None and backend_check(2, None).detail.startswith("gloo is available")


def test_torchruns_master_flags_name_node_0_as_the_rendezvous_endpoint():
    import socket

    from solrl_cli.launch import check_port_free, endpoint, strip_launcher_flags, torchrun_args

    assert endpoint(None, "10.0.0.1", 29400) == "10.0.0.1:29400" and endpoint(None, "node0", None) == "node0:29500"
    assert endpoint("node0:1", None, None) == "node0:1"
    with pytest.raises(SolrlError, match="twice"):
        endpoint("node0:1", "node0", None)
    assert strip_launcher_flags(["--master-addr", "a", "--master-port=1", "--iterations", "3"]) == ["--iterations", "3"]
    assert torchrun_args(2, 2, 1, endpoint(None, "a", 7))[:8] == ["--nproc-per-node", "2", "--nnodes", "2",
                                                                  "--node-rank", "1",
                                                                  "--rdzv-endpoint", "a:7"]
    with socket.socket() as busy:  # node 0's rendezvous port taken: said before torchrun starts
        busy.bind(("", 0))
        busy.listen()
        with pytest.raises(SolrlError, match=f"port {busy.getsockname()[1]} on this node .* is in use"):
            check_port_free(busy.getsockname()[1])

def _children(pid: int) -> dict[int, int]:
    """RANK -> pid of the processes `pid` started (torchrun's workers), from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            env = (stat.parent / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == pid:
            ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"RANK=")]
            if ranks:
                found[int(ranks[0])] = int(stat.parent.name)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc")
def test_a_rank_killed_ends_the_run_within_a_minute_and_leaves_the_checkpoint_intact(tmp_path):
    import signal
    import subprocess
    import sys

    from solrl_core.engine.checkpoint import checkpoint_to_resume
    from solrl_core.faults.manifest import verify
    from solrl_core.io.rundir import list_checkpoints

    run_dir = tmp_path / "run"
    sets = [a for s in (*SETS, "run.checkpoint_every=1", "distributed.strategy=fsdp") for a in ("--set", s)]
    launcher = subprocess.Popen([sys.executable, "-m", "solrl_cli", "train", "--nproc-per-node", "2", "--iterations",
                                 "500",
                                 "--run-dir", str(run_dir), *sets], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 180
        while len(list_checkpoints(run_dir)) < 2 or len(_children(launcher.pid)) < 2:  # mid-run, past a save
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "no second checkpoint within 3 minutes"
            time.sleep(0.2)
        os.kill(_children(launcher.pid)[1], signal.SIGKILL)
        killed = time.monotonic()
        out, err = launcher.communicate(timeout=60)  # a hang fails here
    finally:
        if launcher.poll() is None:
            launcher.kill()
    took = time.monotonic() - killed
    assert launcher.returncode != 0 and took < 60
    assert "error: rank 1" in err and "was killed by signal SIGKILL" in err and f"--resume {run_dir}" in err, err
    saved = list_checkpoints(run_dir)
    assert saved and all(verify(p) is None for p in saved)  # every listed checkpoint matches its manifest
    assert checkpoint_to_resume(run_dir) == saved[-1]


def test_a_2x2_mesh_on_two_launched_nodes_trains_what_one_process_does(tmp_path):
    """Two launcher invocations with --nnodes 2 on this machine, 2 processes each: a replicate 2 x
    shard 2 mesh (HYBRID_SHARD), whose adapters equal a 1-process run's."""
    (tmp_path / "eval.txt").write_text("a red circle\n")
    extra = ("run.prompts_per_iteration=4", f"run.eval_prompts={tmp_path / 'eval.txt'}", "run.iterations=3")
    one = resolve_config("tiny", "sol_rl", sets=[*SETS, *extra, f"run.run_dir={tmp_path / 'one'}"])
    train(one, ev.EventBus(), stop=StopFlag())
    sets = [a for s in (*SETS, *extra, "distributed.strategy=fsdp") for a in ("--set", s)]
    run_two_nodes(tmp_path / "mesh", sets, timeout=400)
    started = _events(tmp_path / "mesh")[0]
    assert ((((((((((("fsdp over 4 processes (mesh replicate 2 x shard 2: sharded within a node, replicated across "
                      "nodes" in started["plan"])))))))))))
    assert "4 prompt groups over 4 processes, 1 each" in started["plan"]
    rewards = [[(e["draft"], e["final"]) for e in _events(tmp_path / d) if e["event"] == "iteration"]
               for d in ("one", "mesh")]
    assert len(rewards[0]) == 3 and rewards[0] == rewards[1]  # the same seeds kept and scored, iteration by iteration
    reference = _adapters(tmp_path / "one", 3)
    assert any(v.abs().max() > 0 for k, v in reference.items() if "lora_B" in k)
    _close(reference, _adapters(tmp_path / "mesh", 3))
