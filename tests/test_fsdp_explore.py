"""A low-precision explore copy under distributed.strategy=fsdp (sharded_copy.py) on a CPU (gloo): a
2-rank sharded run explores at the requested precision and trains what a 1-process run with the
same explore precision does (draft and final rewards, kept seeds, losses, adapters), with the rank
check running sharded; the copy built from the shards equals a replica's copy, and holds no
high-precision weight of a quantized layer; the bytes per weight the estimate counts for each copy
are those the copies hold; and a 4-process two-"node" hybrid mesh explores as one process does (slow)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from solrl_core.config.presets import resolve_config
from tests.helpers import (assert_adapters_close as _close, copy_tensors as _caches,
                           copy_tensors_equal as _caches_equal, explore_config as _config, logged_events as _events,
                           mesh_equals_one_process, same_iterations, saved_adapters as _adapters, spawn as _spawn,
                           train_recording_kept as _train_recording_kept)

PRECISIONS = ("nvfp4-emulated", "fp8-e5m2-tensor")
# (family, explore precision) of the 2-rank runs: sol_rl at both, and naive_quant, which trains on its drafts
RUNS = (*(("sol_rl", p) for p in PRECISIONS), ("naive_quant", "nvfp4-emulated"))


def _worker(rank: int, world: int, port: int, root: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    for family, precision in RUNS:
        _train_recording_kept(_config(root, f"two-{family}-{precision}", "fsdp", precision, family=family),
                              root / "results" / f"{family}-{precision}-rank{rank}.json")


def test_two_sharded_ranks_explore_at_the_requested_precision_as_one_process_does_in_sol_rl_and_naive_quant(tmp_path):
    (tmp_path / "results").mkdir()
    for family, precision in RUNS:
        _train_recording_kept(_config(tmp_path, f"one-{family}-{precision}", "replicate", precision, family=family),
                              tmp_path / "results" / f"{family}-{precision}-one.json")
    _spawn(2, tmp_path, limit=600.0, worker=_worker)

    for family, precision in RUNS:
        one, two = tmp_path / f"one-{family}-{precision}", tmp_path / f"two-{family}-{precision}"
        started = _events(two)[0]
        assert started["explore_precision"] == precision
        assert f"Stage 1: 8 seeds/prompt at {precision}, " in started["plan"]
        assert "fsdp over 2 processes" in started["plan"]
        assert f"under fsdp a whole {precision} copy on each process" in started["machine"]
        for a, b in same_iterations(one, two):
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        checks = [[e for e in _events(d) if e["event"] == "rank_check"] for d in (one, two)]
        # sharded, every iteration; naive_quant regenerates nothing
        assert len(checks[1]) == (2 if family == "sol_rl" else 0)
        for a, b in zip(*checks):
            assert (b["draft_mean"], b["full_mean"]) == pytest.approx((a["draft_mean"], a["full_mean"]), abs=1e-6)
        kept_one = json.loads((tmp_path / "results" / f"{family}-{precision}-one.json").read_text())
        ranks = [json.loads((tmp_path / "results" / f"{family}-{precision}-rank{r}.json").read_text())
                 for r in range(2)]
        assert [r0 + r1 for r0, r1 in zip(*ranks)] == kept_one  # rank 0 holds the first group, rank 1 the second
        reference = _adapters(one, 2)
        assert any(v.abs().max() > 0 for k, v in reference.items() if "lora_B" in k)
        _close(reference, _adapters(two, 2))


def _copy_worker(rank: int, world: int, port: int, root: Path) -> None:
    """Both explore copies of a 2-rank fsdp session (built from the shards, refreshed after a changed
    old adapter), saved whole by rank 0 next to what it holds."""
    from solrl_core.loop.session import open_session
    from solrl_core.precision.quantize import QuantizedGemm
    from solrl_core.runtime import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    distributed.init_from_env()
    for precision in PRECISIONS:
        run = open_session(_config(root, f"copy-{precision}", "fsdp", precision)).run
        try:
            engine = run.engine
            built = _caches(engine.explore_copy.module)
            old = engine.policy.state("old")  # whole on every rank (a collective)
            noise = torch.Generator().manual_seed(0)  # an old adapter moved by training: its B no longer zero
            old = {k: v + 0.01 * torch.randn(v.shape, generator=noise) for k, v in old.items()}
            engine.policy.load_state("old", old)
            engine.refresh_copies()
            held = {m.weight.device.type for m in engine.explore_copy.module.modules() if isinstance(m, QuantizedGemm)}
            assert held == {"meta"}, held  # never holds a quantized layer's high-precision weight
            if rank == 0:
                torch.save({"built": built, "refreshed": _caches(engine.explore_copy.module), "old": old},
                           root / "results" / f"{precision}.pt")
        finally:
            if run.lock is not None:
                run.lock.release()


def test_the_copy_built_from_the_shards_is_a_replicas_copy(tmp_path):
    from solrl_core.loop.session import open_session

    (tmp_path / "results").mkdir()
    _spawn(2, tmp_path, limit=300.0, worker=_copy_worker)
    for precision in PRECISIONS:
        saved = torch.load(tmp_path / "results" / f"{precision}.pt")
        run = open_session(_config(tmp_path, f"replica-{precision}", "replicate", precision)).run
        try:
            engine = run.engine
            assert _caches_equal(saved["built"], _caches(engine.explore_copy.module))
            engine.policy.load_state("old", saved["old"])
            engine.refresh_copies()
            assert _caches_equal(saved["refreshed"], _caches(engine.explore_copy.module))
            assert not _caches_equal(saved["built"], saved["refreshed"])  # the refresh reached the quantized caches
        finally:
            if run.lock is not None:
                run.lock.release()


@pytest.mark.parametrize("precision", ["nvfp4-emulated", "fp8-e5m2-tensor", "fp8-e5m2-delayed", "fp8"])
def test_a_copy_without_its_high_precision_weights_holds_the_bytes_the_estimate_counts(precision):
    """The estimate's bytes per quantized weight (footprint.copy_bytes) against the tensors each copy
    holds on the tiny model (fp32): a replica's copy keeps its weights and the cache, the copy fsdp
    fills (quantize.load_tensor into a meta skeleton) the cache alone, with the same values."""
    import copy

    from solrl_core.engine.rollout import RolloutCopy
    from solrl_core.engine.sharded_copy import meta_copy
    from solrl_core.models import load_model
    from solrl_core.plan.footprint import copy_bytes
    from solrl_core.precision.quantize import LayerRule, QuantizedGemm, load_tensor

    cfg = resolve_config("tiny", "sol_rl")
    transformer = load_model(cfg.model, torch.device("cpu"), torch.float32).transformer
    replica = RolloutCopy(copy.deepcopy(transformer), precision, LayerRule.of(cfg.model))
    lean = RolloutCopy(meta_copy(transformer), precision, LayerRule.of(cfg.model))
    assert lean.on_meta
    lean.materialize(torch.device("cpu"))
    for name, value in transformer.state_dict().items():
        load_tensor(lean.module, name, value)
    assert _caches_equal(_caches(lean.module), _caches(replica.module))

    def per_weight(module: torch.nn.Module, what: str) -> float:
        layers = [m for m in module.modules() if isinstance(m, QuantizedGemm)]
        assert layers
        held = sum(t.numel() * t.element_size() for m in layers for n, t in [*m.named_buffers(), *m.named_parameters()]
                   if not t.is_meta and n.split(".")[-1] in what.split())
        return held / sum(m.weight.numel() for m in layers)

    cache = "weight_src" if precision == "fp8-e5m2-delayed" else "weight_q"  # delayed: cast on every call, as te.Linear
    assert per_weight(lean.module, "weight") == 0  # never held
    assert per_weight(lean.module, cache) == copy_bytes(precision, 4.0)
    # a deep copy's: weights too
    assert per_weight(replica.module, f"weight {cache}") == 4.0 + copy_bytes(precision, 4.0)
    assert per_weight(lean.module, "weight_scale") < 0.25  # fp8's row scales: one fp32 per output row, left out


def test_a_2x2_mesh_on_two_launched_nodes_explores_at_nvfp4_as_one_process_does(tmp_path):
    """Stage 1 on each process's whole NVFP4 copy filled from the hybrid-sharded policy."""
    started = mesh_equals_one_process(tmp_path, "nvfp4-emulated")
    assert (started["explore_precision"] == "nvfp4-emulated"
            and "under fsdp a whole nvfp4-emulated copy" in started["machine"])


def test_a_whole_copy_per_gpu_is_kept_where_the_estimate_says_it_fits_and_else_auto_explores_at_the_run_dtype():
    import dataclasses

    from solrl_core.config.convert import set_value
    from solrl_core.errors import SolrlError
    from solrl_core.plan.fsdp import fsdp_machine
    from solrl_core.plan.resolve import resolve_machine
    from solrl_core.precision.hardware import GpuInfo

    qwen = resolve_config("qwen_image", "sol_rl", "imagereward")
    fp8 = dataclasses.replace(resolve_machine(qwen, torch.device("cpu"), "bf16"), explore_precision="fp8",
                              explore_why="auto on compute capability 9.0")  # what auto resolves on an H100
    h100, ada = GpuInfo(0, "H100", (9, 0), 79.1), GpuInfo(0, "RTX 6000 Ada", (8, 9), 47.5)
    kept = fsdp_machine(fp8, qwen, "bf16", h100, 8)  # estimated 44.8 GiB of 71.2 (docs/distributed.md)
    assert kept.explore_precision == "fp8" and "under fsdp a whole fp8 copy on each process" in kept.explore_why
    dropped = fsdp_machine(fp8, qwen, "bf16", ada, 2)  # 59.0 GiB with the copy, 40.0 without, of 42.8
    assert dropped.explore_precision == "bf16" and not dropped.explore_compile
    assert dropped.explore_why.startswith("auto: a whole fp8 explore copy per GPU takes the estimated peak under fsdp "
                                          "over 2 to 59.0 GiB, a sharded one to ")
    assert "GiB, over 42.8 GiB (40.0 GiB without it)" in dropped.explore_why
    assert dropped.explore_why.endswith("so Stage 1 at the run dtype on the policy's old adapter")
    asked = set_value(qwen, "explore.precision=fp8")
    with pytest.raises(SolrlError, match="a whole fp8 explore copy per GPU takes the estimated peak"):
        fsdp_machine(fp8, asked, "bf16", ada, 2)
    assert fsdp_machine(fp8, asked, "bf16", h100, 8).explore_precision == "fp8"
    assert fsdp_machine(fp8, qwen, "bf16", None, 2).explore_precision == "fp8"  # a CPU: no GPU memory to respect
