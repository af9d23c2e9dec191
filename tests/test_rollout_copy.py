"""The full-precision rollout copy (base + old adapter merged): it computes what the adapter path
computes, follows every refresh in place, and leaves the update's loss and gradient unchanged; the
gradient-checkpointing switch and the compiled update do not change them either; each iteration
reports peak memory.

The compiled-update tests compile with torch's `aot_eager` backend: it runs what solrl hands to
torch.compile (Dynamo's capture of the adapter switching, with its guards, and AOTAutograd's
forward/backward split) without Inductor's code generation, which costs minutes per graph on a
CPU. Inductor on a CPU runs in test_training's compile family."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine.attention import CACHE_TAG
from solrl_core.engine.policy import OLD, TRAINED
from solrl_core.engine.regions import RECOMPILE_LIMIT, repeated_blocks
from solrl_core.engine.rollout import Draws
from solrl_core.errors import SolrlError
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.session import open_session
from solrl_core.loop.stages import roll_out, sync
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.loop.warmup import warm_up_sizes
from tests.helpers import kept_rollouts as _kept, perturb as _perturb, update


def _session(fast_sets, *extra: str, run_dir: str = "run"):
    """An open run (its fixed part: the loop state is not needed here)."""
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.eval_prompts=", *extra, run_dir=run_dir))
    return open_session(cfg).run


def _full_latents(session, seeds):
    """Full-precision, full-step latents of `seeds`: the rollout copy if the session has one."""
    n = len(seeds)
    return roll_out(session, Draws(["a red circle"] * n, torch.zeros(n, dtype=torch.long), torch.tensor(seeds)),
                    session.plan.full_steps, explore=False).latents


def test_the_copy_equals_the_adapter_path_and_follows_each_refresh_in_place(fast_sets):
    with_copy = _session(fast_sets, "sampler.rollout_copy=true", run_dir="a")
    without = _session(fast_sets, "sampler.rollout_copy=false", run_dir="b")
    assert with_copy.engine.rollout_copy is not None and without.engine.rollout_copy is None
    module = with_copy.engine.rollout_copy.module
    pointers = [p.data_ptr() for p in module.parameters()]
    for seed in (1, 2):  # two refreshes with different old adapters
        _perturb(with_copy.engine.policy, seed)
        for name in (TRAINED, OLD):
            without.engine.policy.load_state(name, with_copy.engine.policy.state(name))
        with_copy.engine.refresh_copies()
        ours, theirs = _full_latents(with_copy, [5, 6, 7]), _full_latents(without, [5, 6, 7])
        assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
    # refreshed in place: not rebuilt, a compiled graph stays valid
    assert with_copy.engine.rollout_copy.module is module
    assert [p.data_ptr() for p in module.parameters()] == pointers
    before = _full_latents(with_copy, [5])
    with_copy.engine.policy.update_old(0.0)  # old <- default: the copy must follow at the next sync
    sync(with_copy, LoopState())
    assert not torch.allclose(_full_latents(with_copy, [5]), before, atol=1e-4)


@pytest.mark.parametrize("precision", ["nvfp4-emulated", "fp8-e5m2-tensor"])
def test_the_explore_copy_holds_only_quantized_weights_and_follows_each_refresh_as_a_full_copy(fast_sets, precision):
    """A replica's explore copy is lean (engine._copy): its quantized layers hold their caches and no
    high-precision weight, and after each refresh every tensor it holds equals a full deep copy's
    refreshed with the same merged weights."""
    from solrl_core.engine.engine import base_copy
    from solrl_core.engine.rollout import RolloutCopy
    from solrl_core.precision.quantize import LayerRule, QuantizedGemm

    run = _session(fast_sets, f"explore.precision={precision}", run_dir=precision)
    lean = run.engine.explore_copy
    assert lean.lean and not lean.on_meta
    layers = [m for m in lean.module.modules() if isinstance(m, QuantizedGemm)]
    assert layers and all(m.weight.is_meta for m in layers)
    full = RolloutCopy(base_copy(run.engine.policy.transformer), precision, LayerRule.of(run.config.model))
    assert not full.lean
    for seed in (1, 2):  # two refreshes with different old adapters
        _perturb(run.engine.policy, seed)
        run.engine.refresh_copies()
        full.refresh(run.engine.policy.merged_weights(OLD))
        theirs = {**dict(full.module.named_parameters()), **dict(full.module.named_buffers())}
        held = {k: v for k, v in [*lean.module.named_parameters(), *lean.module.named_buffers()] if not v.is_meta}
        assert len(held) > len(layers)
        different = [k for k, v in held.items() if not torch.equal(v, theirs[k])]
        assert not different, different[:3]
    # a copy a calibration builds (Engine.explore_copy_at, from the policy's adapted transformer) is lean
    # too, and holds the same tensors as the run's own after the same refresh
    built = run.engine.explore_copy_at(precision)
    assert built.lean and not built.on_meta
    again = {k: v for k, v in [*built.module.named_parameters(), *built.module.named_buffers()] if not v.is_meta}
    assert again.keys() == held.keys() and all(torch.equal(v, held[k]) for k, v in again.items())


@pytest.fixture
def aot_eager(monkeypatch):
    """torch.compile with the aot_eager backend (see the module docstring)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))


UNCHANGED = [("sampler.rollout_copy=true",), ("optimizer.checkpointing=true",),
             ("optimizer.compile=true",), ("optimizer.compile=true", "sampler.rollout_copy=false"),
             ("optimizer.compile=true", "optimizer.checkpointing=true")]


@pytest.mark.parametrize("extra", UNCHANGED, ids=["+".join(e) for e in UNCHANGED])
def test_the_update_loss_and_gradient_are_unchanged(fast_sets, extra, aot_eager):
    base = _session(fast_sets, "sampler.rollout_copy=false", "optimizer.checkpointing=false", run_dir="base")
    other = _session(fast_sets, *extra, run_dir="other")
    _perturb(base.engine.policy, 3)
    for name in (TRAINED, OLD):
        other.engine.policy.load_state(name, base.engine.policy.state(name))
    other.engine.refresh_copies()
    compiled = "optimizer.compile=true" in extra
    assert (other.engine.policy_forward is not other.engine.policy.transformer) == compiled
    assert base.engine.policy_forward is base.engine.policy.transformer
    batch = _kept(base, ["a red circle", "two blue squares"])
    results = [update(s, batch, np.random.default_rng(7)) for s in (base, other)]
    for key in ("loss", "policy", "kl"):
        assert getattr(results[0], key) == pytest.approx(getattr(results[1], key), rel=1e-5, abs=1e-9), key
    grads = [torch.cat([p.grad.flatten() for p in s.engine.policy.trainable_parameters()]) for s in (base, other)]
    assert grads[0].abs().max() > 0
    # to float rounding at the gradient's own scale: a sum's rounding follows its largest terms, so an element
    # near zero may differ by 1e-4 of the largest (5.1e-7 of 7e-3 on an AMD EPYC)
    scale = grads[0].abs().max()
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-4 * float(scale)), (grads[0] - grads[1]).abs().max()


def test_each_iteration_reports_peak_memory_per_phase(fast_sets):
    bus = ev.EventBus()
    seen: list[object] = []
    bus.subscribe(seen.append)
    train(resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=1", "run.eval_prompts=")), bus,
          stop=StopFlag())
    (it,) = [e for e in seen if isinstance(e, ev.IterationFinished)]
    assert set(it.peak_memory) == {"explore", "regenerate", "train", "sync", "total"}
    assert all(v > 0 for v in it.peak_memory.values()) and it.memory_source == "process peak RSS"
    assert it.peak_memory["total"] == max(v for k, v in it.peak_memory.items() if k != "total")
    (started,) = [e for e in seen if isinstance(e, ev.RunStarted)]
    assert "rollout copy on" in started.machine and "explore nvfp4-emulated" in started.machine


def test_the_compiled_update_is_compiled_before_iteration_1_and_never_again(fast_sets, aot_eager):
    """Warm-up compiles every graph of the update (trained forward and backward, reference, both
    micro-batch sizes) and of both compiled copies; the iterations then run them without a recompile
    (Dynamo raises if one), all under the one recompile limit they share."""
    bus = ev.EventBus()
    seen: list[object] = []
    bus.subscribe(seen.append)
    bus.subscribe(lambda e: setattr(torch._dynamo.config, "error_on_recompile", True)
                  if isinstance(e, ev.CompileFinished) and e.target == "update" else None)
    # 2 prompts x N=24 drafts in rollout chunks of 16; the rank check's 24 seeds in 16 + 8, Stage 2's 8 kept;
    # the update's 8 samples in micro-batches of 3, 3 and 2: batch sizes on both sides of 16, where
    # the CPU's convolution backend (and so a graph guard) changes
    cfg = resolve_config("tiny", "sol_rl",
                         sets=fast_sets("run.iterations=2", "run.eval_prompts=", "optimizer.compile=true",
                                                          "optimizer.micro_batch=3", "explore.compile=true",
                                                          "sampler.compile=true", "sampler.rollout_copy=true",
                                                          "explore.group_size=24", "explore.rank_check_every=1"))
    torch._dynamo.reset()
    # torch's default limit; config.patch restores both settings after (monkeypatch would hide them)
    with torch._dynamo.config.patch(recompile_limit=8, error_on_recompile=False):
        session = train(cfg, bus, stop=StopFlag())
        limit = torch._dynamo.config.recompile_limit
    compiles = [(e.kind, e.target) for e in seen if isinstance(e, (ev.CompileStarted, ev.CompileFinished))]
    assert compiles == [(kind, target) for target in ("explore copy", "rollout copy", "update")
                        for kind in ("compile_started", "compile")]  # each said before the wait, timed after
    assert warm_up_sizes(session.run) == {"explore copy": [16, 8], "rollout copy": [16, 8, 3, 2], "update": [3, 2]}
    assert len([e for e in seen if isinstance(e, ev.RankCheckResult)]) == 2
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert 3 <= graphs <= limit == RECOMPILE_LIMIT  # at least one graph per compiled module
    its = [e for e in seen if isinstance(e, ev.IterationFinished)]
    assert len(its) == 2 and its[1].loss["kl"] > 0  # the reference ran (at iteration 1 the LoRA B is still 0: KL 0)
    assert "update compiled" in session.run.machine.describe()


def test_kl_beta_zero_runs_no_reference_forward(fast_sets, monkeypatch):
    """The reference only enters the loss through kl_beta: at 0 it is not run, the loss and gradient
    are those of a run that computes it at a vanishing weight, and the KL is reported as not
    measured (NaN)."""
    sessions = [_session(fast_sets, f"algorithm.kl_beta={beta}", run_dir=f"kl{i}")
                for i, beta in enumerate(("0", "1e-30"))]
    _perturb(sessions[0].engine.policy, 4)
    for name in (TRAINED, OLD):
        sessions[1].engine.policy.load_state(name, sessions[0].engine.policy.state(name))
    for s in sessions:
        s.engine.refresh_copies()
    batch = _kept(sessions[0], ["a red circle"])
    results = []
    for s in sessions:
        states: list[object] = []
        real_use = s.engine.policy.use
        monkeypatch.setattr(s.engine.policy, "use", lambda state, real_use=real_use,
                            states=states: states.append(state) or real_use(state))
        results.append((update(s, batch, np.random.default_rng(7)), states))
    (skipped, skipped_states), (with_ref, ref_states) = results
    assert None not in skipped_states and None in ref_states  # None: the reference (adapters disabled)
    assert np.isnan(skipped.kl) and np.isfinite(with_ref.kl) and with_ref.kl > 0
    assert skipped.loss == pytest.approx(with_ref.loss, rel=1e-6)
    grads = [torch.cat([p.grad.flatten() for p in s.engine.policy.trainable_parameters()]) for s in sessions]
    assert grads[0].abs().max() > 0 and torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("sets, copies", [((), "max-autotune-no-cudagraphs"),  # the default: the official copies' mode
                                           (("run.compile_mode=default",), None)])
def test_the_compile_mode_reaches_the_copies_and_the_update_compiles_in_default_mode(fast_sets, monkeypatch, sets,
                                                                                     copies):
    import solrl_core.engine.regions as regions

    modes: list[str | None] = []
    monkeypatch.setattr(torch, "compile", lambda module, mode=None: modes.append(mode) or module)
    real = regions.compile_mode_for
    monkeypatch.setattr(regions, "compile_mode_for", lambda mode, module: mode)  # as on CUDA
    run = _session(fast_sets, *sets, "explore.compile=true", "sampler.compile=true", "optimizer.compile=true")
    blocks = len(repeated_blocks(run.engine.policy.transformer))
    # per block: explore copy and rollout copy in run.compile_mode, then the update in torch's default (no mode)
    assert blocks >= 2 and modes == [copies] * 2 * blocks + [None] * blocks
    # on this CPU the modules themselves compile in torch's default mode
    assert real("max-autotune-no-cudagraphs", run.engine.policy.transformer) == "default"
    with pytest.raises(SolrlError, match="run.compile_mode"):
        resolve_config("tiny", "sol_rl", sets=["run.compile_mode=reduce-overhead"]).validate()


def test_an_fp8_copy_under_max_autotune_runs_its_gemms_untuned_and_the_others_follow_the_mode(monkeypatch):
    """regions.NO_GEMM_AUTOTUNE: the fp8 explore copy's torch.compile gets the mode's own Inductor
    options with GEMMs on ATen alone; every other copy gets the mode itself."""
    import copy

    import solrl_core.engine.regions as regions
    from solrl_core.engine.rollout import RolloutCopy
    from solrl_core.models import load_model
    from solrl_core.precision.quantize import LayerRule

    given: list[dict] = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: given.append(kw) or fn)
    monkeypatch.setattr(regions, "compile_mode_for", lambda mode, module: mode)  # as on CUDA
    cfg = resolve_config("tiny", "sol_rl")
    transformer = load_model(cfg.model, torch.device("cpu"), torch.float32).transformer
    mode = "max-autotune-no-cudagraphs"
    made = {p: RolloutCopy(copy.deepcopy(transformer), p, LayerRule.of(cfg.model), compile=True, compile_mode=mode)
            for p in ("fp8", "nvfp4-emulated", "bf16")}
    untuned = {"options": {**torch._inductor.list_mode_options(mode), "max_autotune_gemm_backends": "ATEN"}}
    assert made["fp8"].compiled.options == untuned and untuned["options"]["max_autotune"]
    assert made["nvfp4-emulated"].compiled.options == made["bf16"].compiled.options == {"mode": mode}
    assert len(given) == 3 * len(repeated_blocks(transformer)) and untuned in given
    assert regions.CompiledBlocks(transformer, "default", gemm_autotune=False).options == {}  # nothing to untune


@pytest.mark.parametrize("family, sets, sizes", [
    ("sol_rl", (), {"explore copy": [24], "rollout copy": [24, 16, 8], "update": [16, 8]}),
    ("naive_scaling", (), {"rollout copy": [24, 16, 8], "update": [16, 8]}),  # Stage 1 at full precision
    ("diffusionnft", (), {"rollout copy": [24, 16, 8], "update": [16, 8]}),  # K seeds, no Stage 2
    # N=30 in chunks of 20: Stage 1's 3 groups of 30 drafts, each in 20 + 10 (one group a batch), Stage 2's 24 in 20 +
    # 4, the rank
    # check's 30 in 20 + 10 (the 10 on the rollout copy comes from it)
    ("sol_rl", ("explore.group_size=30", "sampler.rollout_batch=20", "explore.rank_check_every=5"),
     {"explore copy": [20, 10], "rollout copy": [20, 16, 10, 8, 4], "update": [16, 8]}),
])
def test_warm_up_sizes_are_the_batches_of_an_iteration(family, sets, sizes):
    """3 prompt groups, N=24, K=8, rollout chunks of 24, micro-batches of 16: Stage 1 has 72 drafts,
    Stage 2 and the update 24 samples."""
    from types import SimpleNamespace

    from solrl_core.plan.plan import plan_stages

    cfg = resolve_config("tiny", family,
                         sets=["run.prompts_per_iteration=3", "explore.group_size=24", "selection.group_size=8",
                                               "sampler.rollout_batch=24", "optimizer.micro_batch=16", *sets])
    plan = plan_stages(cfg, "fp32", "nvfp4-emulated" if family == "sol_rl" else "fp32")
    explore_copy = SimpleNamespace(precision=plan.explore_precision) if plan.explore_precision != "fp32" else None
    session = SimpleNamespace(config=cfg, plan=plan, world_size=1, engine=SimpleNamespace(explore_copy=explore_copy))
    got = warm_up_sizes(session)
    assert {k: got[k] for k in sizes} == sizes


def test_without_a_rollout_copy_the_full_rollouts_use_the_compiled_blocks_warmed_up(fast_sets, aot_eager, monkeypatch):
    """No rollout copy, a compiled update and sampler.compile on: Stage 2 runs on the policy's
    compiled blocks (old adapter), which warm-up compiled, so no iteration compiles anything; with
    sampler.compile off (the eager baselines) the same rollouts stay eager."""
    from solrl_core.engine.sampler import Sampler

    for compiled in (True, False):
        seen: list[tuple[bool, bool]] = []  # (explore, blocks compiled) per rollout call
        real = Sampler.generate

        def spy(self, model, network, *args, real=real, seen=seen):
            blocks = repeated_blocks(network)
            seen.append((network is not session_run[0].engine.policy.transformer,
                         blocks[0]._compiled_call_impl is not None))
            return real(self, model, network, *args)

        session_run: list = []
        monkeypatch.setattr(Sampler, "generate", spy)
        bus = ev.EventBus()
        bus.subscribe(lambda e: setattr(torch._dynamo.config, "error_on_recompile", True)
                      if isinstance(e, ev.CompileFinished) and e.target == "update" else None)
        cfg = resolve_config("tiny", "sol_rl",
                             sets=fast_sets("run.iterations=2", "run.eval_prompts=", "optimizer.compile=true",
                                                              "sampler.rollout_copy=false",
                                            f"sampler.compile={str(compiled).lower()}",
                                                              run_dir=f"r{compiled}"))
        opened = open_session(cfg)
        session_run.append(opened.run)
        monkeypatch.setattr("solrl_core.loop.trainer.open_session", lambda *a, **k: opened)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(error_on_recompile=False):
            train(cfg, bus, stop=StopFlag())
        assert opened.run.machine.policy_rollout_compile == compiled
        full = [on for explore_copy, on in seen if not explore_copy]
        assert len(full) == 2 and all(on == compiled for on in full), seen  # Stage 2 of both iterations
        # off again after
        assert not any(b._compiled_call_impl for b in repeated_blocks(opened.run.engine.policy.transformer))


@pytest.mark.parametrize("compiled", [False, True])
def test_the_update_trains_without_cudnn_attention(fast_sets, compiled, aot_eager, monkeypatch):
    """cuDNN attention's backward fails at FLUX's shapes on an H100 (solrl_core/engine/attention.py): every
    forward of the update, eager or compiled, runs with that SDPA backend off, and it is on again after."""
    run = _session(fast_sets, f"optimizer.compile={str(compiled).lower()}")
    batch = _kept(run, ["a red circle", "two blue squares"])
    states: list[tuple[bool, bool]] = []  # (grad enabled, cuDNN SDPA enabled) per policy forward
    real = run.engine.model.velocity

    def spy(network, *args):
        states.append((torch.is_grad_enabled(), torch.backends.cuda.cudnn_sdp_enabled()))
        assert torch.compiler.config.cache_key_tag == CACHE_TAG  # not the cached graphs of an earlier run
        return real(network, *args)

    monkeypatch.setattr(run.engine.model, "velocity", spy)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    update(run, batch, np.random.default_rng(7))
    assert any(grad for grad, _ in states) and not any(cudnn for _, cudnn in states), states
    assert torch.backends.cuda.cudnn_sdp_enabled() and torch.compiler.config.cache_key_tag == ""


def test_the_repeated_blocks_are_the_stacks_of_identical_blocks_and_nothing_inside_them():
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.pair = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])  # identical, but inside a block

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(3)])
            self.mixed = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])  # not a stack of one class

    net = Net()
    assert repeated_blocks(net) == list(net.blocks)
    net._repeated_blocks = ["Linear"]  # a model that declares its blocks (diffusers' attribute) is taken at its word
    assert repeated_blocks(net) == [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert repeated_blocks(nn.Linear(4, 4)) == []
