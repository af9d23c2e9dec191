"""Copies sharded like the policy under distributed.strategy=fsdp (sharded_copy.shard_copy) on a CPU
(gloo): a 2-rank run explores at nvfp4-emulated on a low-precision copy each rank holds half of
(distributed.copy_layout=sharded), and, with sampler.rollout_copy=true, runs Stage 2 and v_old on a
sharded full-precision rollout copy, each training what a 1-process run with the same copies does;
both copies' gathered tensors equal a replica's after they are built and after a refresh; an fp8 copy
(mixed dtypes, a padded chunk) gathers to a whole one; a 2x2 mesh (slow); and the estimate's
arithmetic for the sharded layouts, and the layout auto chooses by it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from tests.helpers import (assert_adapters_close as _close, copy_tensors as _caches,
                           copy_tensors_equal as _caches_equal, explore_config as _config, logged_events as _events,
                           same_iterations, saved_adapters as _adapters, spawn as _spawn,
                           train_recording_kept as _train_recording_kept)

PRECISION = "nvfp4-emulated"
SHARDED = "distributed.copy_layout=sharded"
ROLLOUT = "sampler.rollout_copy=true"  # a full-precision rollout copy, sharded like the policy under fsdp


def _gathered(module: torch.nn.Module) -> tuple[dict[str, torch.Tensor], int, int]:
    """Every tensor the copy computes with, whole, gathered by FSDP2's own all-gather of each unit (a
    collective), and the elements of its sharded tensors this rank holds against their whole count."""
    from torch.distributed.tensor import DTensor

    from solrl_core.engine.sharding import fsdp_units

    shards = [p for p in module.parameters() if isinstance(p, DTensor)]
    held, whole = sum(p.to_local().numel() for p in shards), sum(p.numel() for p in shards)
    units = [unit for _, unit in fsdp_units(module)]
    for unit in units:
        unit.unshard()
    out = {k: v.clone() for k, v in module.named_buffers()}
    out.update({k: v.detach().clone() for k, v in module.named_parameters() if not v.is_meta})
    assert not any(isinstance(v, DTensor) for v in out.values())
    for unit in units:
        unit.reshard()
    return out, held, whole


def _fp8_copies_agree(engine) -> None:  # type: ignore[no-untyped-def]
    """An fp8 copy (e4m3 caches, fp32 row scales of dim 0 one: mixed dtypes, a chunk padded) sharded
    like the policy gathers to what a whole one filled from the same shards holds."""
    from solrl_core.engine.rollout import RolloutCopy
    from solrl_core.engine.sharded_copy import meta_copy, refresh_from_shards
    from solrl_core.models import load_model
    from solrl_core.precision.quantize import LayerRule

    base = load_model(engine.config.model, engine.device, engine.dtype).transformer
    sharded, whole = (RolloutCopy(meta_copy(base), "fp8", LayerRule.of(engine.config.model), sharded=s)
                      for s in (True, False))
    refresh_from_shards(engine.policy, [sharded, whole], engine.device)
    gathered, _, _ = _gathered(sharded.module)
    assert any(v.dtype == torch.float8_e4m3fn for v in gathered.values())
    assert gathered.keys() == _caches(whole.module).keys()
    assert all(torch.equal(v.float(), _caches(whole.module)[k].float()) for k, v in gathered.items())


def _worker(rank: int, world: int, port: int, root: Path) -> None:
    """A 2-iteration sol_rl run on both copies sharded; then a session's copies gathered as built and as
    refreshed after a changed old adapter (saved by rank 0), each left sharded after a forward; an fp8
    copy against a whole one; and a tensor whose dim 0 does not divide, written through its shard."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from solrl_core.engine.sharded_copy import policy_mesh
    from solrl_core.loop.session import open_session
    from solrl_core.precision.quantize import load_tensor
    from solrl_core.runtime import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    _train_recording_kept(_config(root, "two-rollout", "fsdp", PRECISION, SHARDED, ROLLOUT),
                          root / "results" / f"kept-rollout-rank{rank}.json")
    distributed.init_from_env()
    run = open_session(_config(root, "copy", "fsdp", PRECISION, SHARDED, ROLLOUT)).run
    try:
        engine = run.engine
        built, held, whole = _gathered(engine.explore_copy.module)
        full_built, full_held, full_whole = _gathered(engine.rollout_copy.module)
        old = engine.policy.state("old")
        noise = torch.Generator().manual_seed(0)  # an old adapter moved by training: its B no longer zero
        old = {k: v + 0.01 * torch.randn(v.shape, generator=noise) for k, v in old.items()}
        engine.policy.load_state("old", old)
        engine.refresh_copies()
        refreshed, _, _ = _gathered(engine.explore_copy.module)
        full_refreshed, _, _ = _gathered(engine.rollout_copy.module)
        assert 0 < full_held <= full_whole / 2 + 64  # half the run-dtype copy, give or take a padded chunk
        for on, made in (("explore", engine.explore_copy), ("rollout", engine.rollout_copy)):
            engine.generate(engine.conditioning(run.prompts[:1] * 2), torch.tensor([1, 2]), 2, on=on)
            whole_now = [n for n, p in made.module.named_parameters() if not p.is_meta and not isinstance(p, DTensor)]
            assert whole_now == [], (on, whole_now[:3])  # every gathered unit freed after its forward, the root too
        _fp8_copies_agree(engine)
        odd = torch.nn.Linear(4, 5)  # dim 0 of 5 over 2 ranks: FSDP2 pads the second rank's chunk
        fully_shard(odd, mesh=policy_mesh(engine.policy))
        load_tensor(odd, "weight", torch.arange(20.0).reshape(5, 4))
        assert torch.equal(odd.weight.full_tensor(), torch.arange(20.0).reshape(5, 4))
        if rank == 0:
            torch.save({"built": built, "refreshed": refreshed, "old": old, "held": held, "whole": whole,
                        "full_built": full_built, "full_refreshed": full_refreshed},
                       root / "results" / "copy.pt")
    finally:
        if run.lock is not None:
            run.lock.release()


def _same_run(root: Path, one: str, two: str, kept: str) -> None:
    """The 2-rank sharded run `two` did what the 1-process run `one` did: draft and final rewards,
    losses, the rank check, the kept seeds (rank 0 holds the first group, rank 1 the second), adapters."""
    same_iterations(root / one, root / two)
    checks = [[e for e in _events(root / d) if e["event"] == "rank_check"] for d in (one, two)]
    assert len(checks[1]) == 2  # the rank check on the sharded copies, every iteration
    for a, b in zip(*checks):
        assert (b["draft_mean"], b["full_mean"]) == pytest.approx((a["draft_mean"], a["full_mean"]), abs=1e-6)
    ranks = [json.loads((root / "results" / f"{kept}-rank{r}.json").read_text()) for r in range(2)]
    assert [r0 + r1 for r0, r1 in zip(*ranks)] == json.loads((root / "results" / f"{kept}-one.json").read_text())
    _close(_adapters(root / one, 2), _adapters(root / two, 2))


def test_two_ranks_on_sharded_copies_train_what_one_process_does_and_the_copies_are_a_replicas(tmp_path):
    """The nvfp4 explore copy and a full-precision rollout copy, both sharded, against a 1-process run
    with the same copies; then both copies gathered against a replica's."""
    from solrl_core.loop.session import open_session

    (tmp_path / "results").mkdir()
    _train_recording_kept(_config(tmp_path, "one-rollout", "replicate", PRECISION, ROLLOUT),
                          tmp_path / "results" / "kept-rollout-one.json")
    _spawn(2, tmp_path, limit=600.0, worker=_worker)

    started = _events(tmp_path / "two-rollout")[0]
    assert started["explore_precision"] == PRECISION and started["copy_layout"] == "sharded"
    assert f"under fsdp a {PRECISION} copy sharded like the policy, 1/2 on each process" in started["machine"]
    assert ((((((((((((((((((((("rollout copy on (as configured; under fsdp sharded like the policy, 1/2 on each "
                                "process" in started["machine"])))))))))))))))))))))
    assert "on the rollout copy" in started["plan"]
    _same_run(tmp_path, "one-rollout", "two-rollout", "kept-rollout")

    saved = torch.load(tmp_path / "results" / "copy.pt")
    assert saved["whole"] > 0 and saved["held"] <= saved["whole"] / 2 + 64  # half, give or take a padded chunk
    run = open_session(_config(tmp_path, "replica", "replicate", PRECISION, ROLLOUT)).run
    try:
        engine = run.engine
        replica, full = _caches(engine.explore_copy.module), _caches(engine.rollout_copy.module)
        assert {k for k in saved["built"] if k.endswith("weight_q")} == {k for k in replica if k.endswith("weight_q")}
        assert saved["full_built"].keys() == full.keys()
        assert _caches_equal(saved["built"], replica) and _caches_equal(saved["full_built"], full)
        engine.policy.load_state("old", saved["old"])
        engine.refresh_copies()
        assert _caches_equal(saved["refreshed"], _caches(engine.explore_copy.module))
        assert _caches_equal(saved["full_refreshed"], _caches(engine.rollout_copy.module))
        assert not _caches_equal(saved["built"], saved["refreshed"])  # the refresh reached the sharded caches
        assert not _caches_equal(saved["full_built"], saved["full_refreshed"])
    finally:
        if run.lock is not None:
            run.lock.release()


def test_the_sharded_copy_counts_one_shard_and_its_gathered_blocks_and_auto_takes_it_where_a_whole_one_is_over():
    from solrl_core.config.convert import set_value
    from solrl_core.config.presets import resolve_config
    from solrl_core.plan.fsdp import GATHERED_SHARE, fsdp_machine, sharded_estimate
    from solrl_core.errors import SolrlError
    from solrl_core.plan.footprint import estimate_memory
    from solrl_core.plan.resolve import FIT_SHARE, resolve_machine
    from solrl_core.precision.hardware import GpuInfo

    qwen = resolve_config("qwen_image", "sol_rl", "imagereward")
    replica = estimate_memory(qwen, "fp8", "bf16", True, rollout_copy=False)
    whole = sharded_estimate(qwen, "bf16", 8, explore_precision="fp8")
    sharded = sharded_estimate(qwen, "bf16", 8, explore_precision="fp8", copy_layout="sharded")
    assert whole.explore_copy == replica.explore_copy > 0
    assert sharded.explore_copy == pytest.approx(replica.explore_copy / 8 + replica.explore_copy * GATHERED_SHARE)
    assert sharded.policy == whole.policy == pytest.approx(replica.policy / 8 + replica.policy * GATHERED_SHARE)
    assert whole.peak - sharded.peak == pytest.approx(replica.explore_copy * (1 - 1 / 8 - GATHERED_SHARE))
    one = sharded_estimate(qwen, "bf16", 1, explore_precision="fp8", copy_layout="sharded")
    assert one.explore_copy == replica.explore_copy  # one process: nothing gathered, nothing divided

    from solrl_core.plan.resolve import COMPILED_ANYWAY

    fp8 = dataclasses.replace(resolve_machine(qwen, torch.device("cpu"), "bf16"), explore_precision="fp8",
                              explore_compile=True,
                              explore_why=f"auto on compute capability 9.0{COMPILED_ANYWAY}: eager fp8 is slower")
    peaks = [sharded_estimate(qwen, "bf16", 2, explore_precision="fp8", copy_layout=c).peak
             for c in ("whole", "sharded")]
    # a sharded copy fits, a whole one not
    between = GpuInfo(0, "between", (9, 0), (peaks[0] + peaks[1]) / 2 / FIT_SHARE)
    chosen = fsdp_machine(fp8, qwen, "bf16", between, 2)
    assert (chosen.explore_precision, chosen.explore_layout, chosen.explore_compile) == ("fp8", "sharded", False)
    assert f"auto: a whole copy's {peaks[0]:.1f} GiB over" in chosen.explore_why
    assert "compiled" not in chosen.explore_why and ", eager (" in chosen.explore_why  # a sharded copy runs eager
    roomy = GpuInfo(0, "roomy", (9, 0), peaks[0] / FIT_SHARE + 1)
    kept = fsdp_machine(fp8, qwen, "bf16", roomy, 2)
    assert kept.explore_layout == "whole" and kept.explore_compile and COMPILED_ANYWAY in kept.explore_why
    assert fsdp_machine(fp8, set_value(qwen, SHARDED), "bf16", roomy, 2).explore_layout == "sharded"
    with pytest.raises(SolrlError, match="a whole fp8 explore copy per GPU takes the estimated peak"):
        fsdp_machine(fp8, set_value(set_value(qwen, "explore.precision=fp8"), "distributed.copy_layout=whole"),
                     "bf16", between, 2)
    small = GpuInfo(0, "small", (9, 0), peaks[1] / FIT_SHARE - 1)
    dropped = fsdp_machine(fp8, qwen, "bf16", small, 2)
    assert (dropped.explore_precision, dropped.explore_layout) == ("bf16", "")
    assert dropped.explore_why.startswith(f"auto: a whole fp8 explore copy per GPU takes the estimated peak under fsdp "
                                          f"over 2 to {peaks[0]:.1f} GiB, a sharded one to {peaks[1]:.1f} GiB, over ")
    with pytest.raises(SolrlError, match="unknown distributed.copy_layout"):
        set_value(qwen, "distributed.copy_layout=striped").validate()

    # sampler.rollout_copy=auto under fsdp: a sharded rollout copy where the estimate with it fits the GPU.
    assert (not kept.rollout_copy and "auto: estimated peak" in kept.rollout_copy_why
            and " over " in kept.rollout_copy_why)
    with_copy = sharded_estimate(qwen, "bf16", 2, explore_precision="fp8", copy_layout="whole", rollout_copy=True).peak
    big = GpuInfo(0, "big", (9, 0), with_copy / FIT_SHARE + 1)
    both = fsdp_machine(fp8, qwen, "bf16", big, 2)
    assert (both.explore_layout, both.rollout_copy, both.rollout_compile) == ("whole", True, False)
    assert f"auto: estimated peak {with_copy:.1f} GiB with it, within" in both.rollout_copy_why
    assert not fsdp_machine(fp8, set_value(qwen, "sampler.compile=true"), "bf16", big, 2).rollout_copy

    from solrl_core.doctor.strategy import strategy_check, strategy_estimates

    # The doctor's per-strategy table lays the copy out as the run would: whole where it fits, else sharded.
    assert strategy_estimates(qwen, "fp8", "bf16", 2)["fsdp/2"] == pytest.approx(peaks[0])  # no GPU: whole
    assert strategy_estimates(qwen, "fp8", "bf16", 2,
                              between.memory_gib * FIT_SHARE)["fsdp/2"] == pytest.approx(peaks[1])
    assert strategy_estimates(set_value(qwen, "distributed.copy_layout=whole"), "fp8", "bf16", 2,
                              between.memory_gib * FIT_SHARE)["fsdp/2"] == pytest.approx(peaks[0])
    assert f"fsdp over 2 {peaks[1]:.1f} GiB" in strategy_check(set_value(qwen, "explore.precision=fp8"), between,
                                                               2).detail


def _explore_only_worker(rank: int, world: int, port: int, root: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    _train_recording_kept(_config(root, "two", "fsdp", PRECISION, SHARDED), root / "results" / f"kept-rank{rank}.json")


@pytest.mark.slow
def test_two_ranks_on_a_sharded_explore_copy_alone_train_what_one_process_does(tmp_path):
    """The sharded nvfp4 explore copy without a rollout copy: Stage 2 and v_old on the sharded policy."""
    (tmp_path / "results").mkdir()
    _train_recording_kept(_config(tmp_path, "one", "replicate", PRECISION), tmp_path / "results" / "kept-one.json")
    _spawn(2, tmp_path, limit=600.0, worker=_explore_only_worker)
    started = _events(tmp_path / "two")[0]
    assert started["explore_precision"] == PRECISION and started["copy_layout"] == "sharded"
    assert "rollout copy off (as configured: rollouts and v_old on the policy's old adapter" in started["machine"]
    _same_run(tmp_path, "one", "two", "kept")


@pytest.mark.slow
def test_a_2x2_mesh_on_two_launched_nodes_explores_on_a_sharded_copy_as_one_process_does(tmp_path):
    """Two launcher invocations with --nnodes 2 on this machine, 2 processes each (a replicate 2 x
    shard 2 mesh): the copy sharded within a node and replicated across nodes, as the policy is."""
    from tests.helpers import mesh_equals_one_process

    assert mesh_equals_one_process(tmp_path, PRECISION, SHARDED)["copy_layout"] == "sharded"
