"""CPU lanes (runtime/lanes.py): a rollout's independent batches, and the update's micro-steps, run
side by side on one torch thread each. Rollouts and the update's loss and gradient give bit for bit
what one thread computes; everything per thread that the work needs (grad mode, CPU autocast, FP8
attention's swap) holds in every lane."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from solrl_core.config.presets import resolve_config
from solrl_core.engine.policy import OLD, TRAINED
from solrl_core.loop.session import open_session
from solrl_core.precision import fp8_attention
from solrl_core.runtime.lanes import map_in_lanes
from tests.helpers import kept_rollouts as _kept, perturb as _perturb, update


def test_lanes_run_side_by_side_in_order_single_threaded_and_restore_torch_threads():
    threads = torch.get_num_threads()
    both = threading.Barrier(2, timeout=30)  # passes only when two items run at the same time

    def work(i: int) -> tuple[int, int, str]:
        both.wait()
        return i, torch.get_num_threads(), threading.current_thread().name

    out = map_in_lanes(work, range(4), 2)
    assert [i for i, _, _ in out] == [0, 1, 2, 3]
    assert {n for _, n, _ in out} == {1}
    assert all(name.startswith("solrl-lane") for _, _, name in out)
    assert torch.get_num_threads() == threads
    assert map_in_lanes(lambda i: threading.current_thread() is threading.main_thread(), range(3), 1) == [True] * 3


def test_lanes_carry_grad_mode_and_cpu_autocast_and_raise_the_first_error():
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        seen = map_in_lanes(lambda _: (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"),
                                       torch.get_autocast_dtype("cpu")), range(2), 2)
    assert seen == [(False, True, torch.bfloat16)] * 2
    threads = torch.get_num_threads()

    def fails(i: int) -> int:
        if i == 1:
            raise ValueError("lane 1")
        return i

    with pytest.raises(ValueError, match="lane 1"):
        map_in_lanes(fails, range(3), 2)
    assert torch.get_num_threads() == threads


def _run(fast_sets, name: str, *extra: str):
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.eval_prompts=", *extra, run_dir=name))
    return open_session(cfg).run


@pytest.mark.parametrize("on,batch", [("explore", 4), ("rollout", 4), ("ema", 4)])
def test_rollouts_in_lanes_equal_one_lane_bit_for_bit(fast_sets, on, batch, monkeypatch):
    """Several batches, a lane each."""
    run = _run(fast_sets, f"{on}{batch}", f"sampler.rollout_batch={batch}")
    engine = replace(run.engine, lanes=2)
    assert engine.lanes_for(on) == 2
    cond = engine.conditioning(["a red circle", "two blue squares"] * 6)
    seeds = torch.arange(12)
    groups = torch.tensor([0] * 6 + [1] * 6) if on == "explore" else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what a lane computes: one torch thread's values (at a few rows a batch, two
    try:                      # threads may split a kernel's sums differently)
        one = replace(engine, lanes=1).generate(cond, seeds, 3, on, to_cpu=on == "ema", groups=groups)
    finally:
        torch.set_num_threads(threads)
    names: set[str] = set()
    velocity = engine.model.velocity
    monkeypatch.setattr(engine.model, "velocity", lambda *a: names.add(threading.current_thread().name) or velocity(*a))
    two = engine.generate(cond, seeds, 3, on, to_cpu=on == "ema", groups=groups)
    assert names and all(n.startswith("solrl-lane") for n in names)  # every batch ran in a lane
    assert torch.equal(one.latents, two.latents) and torch.equal(one.images, two.images)


def test_a_compiled_network_or_a_gpu_runs_one_lane(fast_sets):
    engine = replace(_run(fast_sets, "compiled", "sampler.rollout_batch=4").engine, lanes=2)
    assert engine.lanes_for("base") == 2
    assert replace(engine, rollout_copy=None, policy_rollout_compile=True).lanes_for("rollout") == 1
    object.__setattr__(engine.explore_copy, "compiled", object())  # as a copy compiled block by block holds
    assert engine.lanes_for("explore") == 1
    assert replace(engine, device=torch.device("cuda")).lanes_for("base") == 1


def test_the_update_in_lanes_gives_one_threads_loss_and_gradient_bit_for_bit(fast_sets, monkeypatch):
    """The same update with one lane and with two: the same micro-steps and their gradients summed in
    the same order, so one torch thread's values bit for bit. One run, at learning rate 0 (the step
    leaves the weights as they were, so the second update sees the first one's)."""
    run = _run(fast_sets, "update", "optimizer.micro_batch=2", "sampler.rollout_batch=4")
    _perturb(run.engine.policy, 5)
    run.engine.refresh_copies()
    for group in run.optimizer.param_groups:
        group["lr"] = 0.0
    batch = _kept(run, ["a red circle", "two blue squares"])
    names: set[str] = set()
    velocity = run.engine.model.velocity
    monkeypatch.setattr(run.engine.model, "velocity",
                        lambda *a: names.add(threading.current_thread().name) or velocity(*a))
    params = run.engine.policy.trainable_parameters()
    results, grads = [], []
    threads = torch.get_num_threads()
    for lanes in (1, 2):
        torch.set_num_threads(1 if lanes == 1 else threads)  # one lane: one torch thread's values, as each lane's
        try:
            laned = replace(run, engine=replace(run.engine, lanes=lanes))
            results.append(update(laned, batch, np.random.default_rng(7)))
        finally:
            torch.set_num_threads(threads)
        grads.append(torch.cat([p.grad.flatten() for p in params]))
        assert any(n.startswith("solrl-lane") for n in names) == (lanes == 2)
    assert grads[0].abs().max() > 0 and torch.equal(grads[0], grads[1])
    one, two = ((r.loss, r.policy, r.kl, r.grad_norm) for r in results)
    assert one == two


def test_fp8_attention_stays_swapped_in_until_the_last_lane_leaves():
    class Net(torch.nn.Module):
        def forward(self, x: torch.Tensor, gate: threading.Barrier, leave: threading.Event, first: bool) -> bool:
            gate.wait()  # both lanes inside
            if first:
                return F.scaled_dot_product_attention is not ORIGINAL
            leave.wait(timeout=30)  # the first lane has left
            return F.scaled_dot_product_attention is not ORIGINAL

    ORIGINAL = F.scaled_dot_product_attention
    net = Net()
    fp8_attention.Swap(net)
    gate, left = threading.Barrier(2, timeout=30), threading.Event()
    x = torch.zeros(1)

    def lane(first: bool) -> bool:
        out = net(x, gate, left, first)
        if first:
            left.set()
        return out

    assert map_in_lanes(lane, [True, False], 2) == [True, True]
    assert F.scaled_dot_product_attention is ORIGINAL
