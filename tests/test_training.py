"""The loop end to end on the tiny model: families, stage-2 noise, resume, interrupt, checkpoint format."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.loop.session import open_session
from solrl_core.loop.stages import explore, regenerate, score_drafts, select_seeds
from solrl_core.loop.trainer import StopFlag, train
from tests.helpers import train_recording as _run


@pytest.mark.parametrize("family", ["sol_rl", "naive_scaling", "naive_quant", "diffusionnft",
                                    pytest.param("compile", marks=pytest.mark.slow)])
def test_each_family_completes_two_iterations(family, fast_sets):
    session, seen = _run(fast_sets("run.iterations=2"), family)
    its = [e for e in seen if isinstance(e, ev.IterationFinished)]
    assert [e.iteration for e in its] == [1, 2]
    assert set(its[0].seconds) == set(ev.PHASES)
    assert all(np.isfinite(e.loss["loss"]) for e in its)
    assert (session.run.run_dir / "checkpoints" / "iter_000002" / "pytorch_lora_weights.safetensors").is_file()
    kinds = [json.loads(line)["event"] for line in (session.run.run_dir / "events.jsonl").read_text().splitlines()]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished" and kinds.count("iteration") == 2
    regenerates = its[0].seconds["regenerate"] > 0
    assert regenerates == (family == "sol_rl")
    compiled = [e.target for e in seen if isinstance(e, ev.CompileFinished)]
    assert compiled == (["rollout copy"] if family == "compile" else [])  # compiled once, before iteration 1
    # auto on a CPU: v_old (and full-precision rollouts) on the merged copy; the official peft baselines
    # roll out on the policy's old adapter (their family presets: sampler.rollout_copy=false)
    assert (session.run.engine.rollout_copy is None) == (family in ("naive_scaling", "diffusionnft"))
    assert (its[0].draft is not None) == (family != "diffusionnft")


def test_stage2_regenerates_exactly_the_stage1_noise(fast_sets):
    # Explore at full precision and full steps: Stage 2 must then reproduce Stage 1 bit for bit,
    # which holds only if each seed rebuilds the same initial noise.
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("explore.precision=fp32", "explore.steps=4"))
    session = open_session(cfg)
    rng = np.random.default_rng(0)
    drafts = explore(session.run, ["a red circle", "two blue squares"], rng)
    kept = drafts.subset(select_seeds(session.run, score_drafts(session.run, session.state, ev.EventBus(), drafts),
                                      rng))
    finals = regenerate(session.run, kept)
    assert torch.equal(finals.seeds, kept.seeds)
    tol = _roundoff_bound(session.run.engine.model.transformer, steps=4, dtype=finals.latents.dtype,
                          scale=kept.latents.abs().max().item())
    assert (finals.latents - kept.latents).abs().max().item() <= tol
    assert torch.allclose(finals.rewards, kept.rewards)
    # The bound is far below what another seed's noise gives, so the check can tell the two apart.
    other = regenerate(session.run, dataclasses.replace(kept, seeds=kept.seeds + 1))
    assert (other.latents - kept.latents).abs().max().item() > 1000 * tol


def _roundoff_bound(transformer: torch.nn.Module, steps: int, dtype: torch.dtype, scale: float) -> float:
    """How far two evaluations of the same samples may drift apart in `dtype` when only the batch
    around them differs (Stage 1 runs N seeds a batch, Stage 2 the kept K, so the GEMMs block and
    sum differently, and the thread count moves that too). Round-off of one dot product of length k
    grows like sqrt(k)*eps; a chain of G GEMMs per step compounds it like sqrt(G) (independent
    errors); the Euler steps add theirs. On the tiny model (166 linear layers, k <= 256, 4 steps) the
    bound is 1.05e-4; measured with torch 2.14.1 on 1-4 threads: at most 1.0e-5."""
    linears = [m for m in transformer.modules() if isinstance(m, torch.nn.Linear)]
    k = max(m.in_features for m in linears)
    return steps * math.sqrt(len(linears)) * math.sqrt(k) * torch.finfo(dtype).eps * scale


def test_explore_runs_on_the_quantized_copy(fast_sets):
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("explore.steps=4"))
    session = open_session(cfg)
    assert session.run.engine.explore_copy is not None and session.run.engine.explore_copy.report.quantized
    rng = np.random.default_rng(0)
    drafts = explore(session.run, ["a red circle"], rng)
    kept = drafts.subset(select_seeds(session.run, score_drafts(session.run, session.state, ev.EventBus(), drafts),
                                      rng))
    finals = regenerate(session.run, kept)
    diff = (finals.latents - kept.latents).abs().mean()
    assert 0 < diff < 0.15 * finals.latents.abs().mean()  # NVFP4 changes the images, a little
    report = json.loads((session.run.run_dir / "quantization_report.json").read_text())
    names = {e["name"] for e in report["entries"] if e["quantized"]}
    assert any(n.endswith("attn1.to_q") for n in names) and any(n.endswith("ff.conv_inverted") for n in names)
    assert not any("proj_out" in n or "patch_embed" in n for n in names)


def _adapter(session, which):
    return session.run.engine.policy.state(which)


def test_resume_after_interrupt_equals_uninterrupted(fast_sets):
    straight, _ = _run(fast_sets("run.iterations=4", run_dir="a"))
    stopped, seen = _run(fast_sets("run.iterations=4", run_dir="b"), stop_after=2)
    finished = [e for e in seen if isinstance(e, ev.RunFinished)][0]
    assert finished.reason == "interrupted" and finished.iteration == 2
    assert (stopped.run.run_dir / "checkpoints" / "iter_000002").is_dir()
    resumed, seen = _run(fast_sets("run.iterations=4", run_dir="b"), resume=True)
    assert [e.iteration for e in seen if isinstance(e, ev.IterationFinished)] == [3, 4]
    assert resumed.state.history == pytest.approx(straight.state.history, abs=1e-7)
    for which in ("default", "old", "ema"):
        a, b = _adapter(straight, which), _adapter(resumed, which)
        assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), which


def test_saved_lora_loads_in_plain_diffusers(fast_sets):
    from diffusers import SanaPipeline

    from solrl_core.models import load_model

    session, _ = _run(fast_sets("run.iterations=1"))
    ckpt = session.run.run_dir / "checkpoints" / "iter_000001"
    fresh = load_model(session.run.config.model, torch.device("cpu"), torch.float32)
    pipe = SanaPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=fresh.transformer, scheduler=None)
    pipe.load_lora_weights(str(ckpt))
    cond = session.run.engine.conditioning(["a red circle", "a blue square"])
    x, s = torch.randn(2, *session.run.engine.model.latent_shape), torch.tensor([0.8, 0.3])
    with torch.no_grad():
        tuned = session.run.engine.model.velocity(session.run.engine.policy.transformer, x, s, cond)
        reloaded = fresh.velocity(pipe.transformer, x, s, cond)
        with session.run.engine.policy.use(None) as base:
            untuned = session.run.engine.model.velocity(base, x, s, cond)
    assert torch.allclose(tuned, reloaded, atol=1e-5)
    assert not torch.allclose(tuned, untuned, atol=1e-5)  # the LoRA did change the model


def test_random_tiny_model_raises_the_jpeg_reward(fast_sets):
    # Random weights can still climb a pixel statistic: the JPEG reward goes up within a few steps.
    bus = ev.EventBus()
    cfg = resolve_config("tiny_random", "sol_rl", sets=fast_sets("run.iterations=12", "explore.group_size=16",
                                                                  "selection.group_size=8",
                                                                 "run.prompts_per_iteration=4"))
    session = train(cfg, bus, stop=StopFlag())
    assert np.mean(session.state.history[-3:]) > session.state.history[0]


def test_crash_reports_failed_and_leaves_the_last_checkpoint_whole(fast_sets, monkeypatch):
    import solrl_core.loop.stages as stages

    calls = {"n": 0}
    real_update = stages.update

    def failing_update(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated crash")
        return real_update(*args, **kwargs)

    monkeypatch.setattr(stages, "update", failing_update)
    seen = []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=3", "run.checkpoint_every=1"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, bus, stop=StopFlag())
    finished = [e for e in seen if isinstance(e, ev.RunFinished)][0]
    assert finished.reason == "failed" and finished.iteration == 1
    ckpts = cfg.run.run_dir + "/checkpoints"
    import os
    assert sorted(os.listdir(ckpts)) == ["iter_000001"]  # no temporary leftovers


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_at_a_safe_point_and_saves(tmp_path, signame):
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import FAST

    args = [sys.executable, "-m", "solrl_cli", "train", "--iterations", "200", "--run-dir", str(tmp_path / "r")]
    for s in FAST:
        args += ["--set", s]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("iter    1/"):
            proc.send_signal(getattr(signal, signame))
            break
    out = "".join(lines) + proc.stdout.read()
    assert proc.wait(timeout=120) == 130, out
    assert "stopped after iteration" in out
    saved = os.listdir(tmp_path / "r" / "checkpoints")
    assert len(saved) == 1 and saved[0].startswith("iter_")


def test_one_bus_serves_consecutive_runs(fast_sets):
    bus = ev.EventBus()
    seen = []
    bus.subscribe(seen.append)
    for name in ("one", "two"):
        train(resolve_config("tiny", "diffusionnft", sets=fast_sets("run.iterations=1", run_dir=name)), bus,
              stop=StopFlag())
    assert [e.kind for e in seen].count("run_finished") == 2


def test_evaluation_runs_on_base_then_ema_weights_and_restores_the_live_adapter(fast_sets):
    sets = fast_sets("run.iterations=2", "run.eval_prompts=tinyworld_heldout", "run.eval_every=1", "run.eval_seeds=1")
    session, seen = _run(sets)
    evals = [e for e in seen if isinstance(e, ev.EvalFinished)]
    assert [(e.weights, e.iteration) for e in evals] == [("base", 0), ("ema", 1), ("ema", 2)]
    assert evals[0].samples == 64 and 0.0 <= evals[0].mean <= 1.0
    assert "tinyworld_geneval.strict_accuracy" in evals[0].extras
    # each EMA evaluation's change since the base gets paired standard errors, overall and per kind
    assert evals[0].delta_se == {} and all(e.delta_se["mean"] >= 0.0 for e in evals[1:])
    assert set(evals[2].delta_se) == {"mean", "tinyworld_geneval.binding", "tinyworld_geneval.position"}
    if evals[2].mean != evals[0].mean:  # some image changed: the differences have a spread
        assert evals[2].delta_se["mean"] > 0.0
    live = session.run.engine.policy.state("default")
    with session.run.engine.policy.weights("ema"):
        pass
    after = session.run.engine.policy.state("default")
    assert all(torch.equal(live[k], after[k]) for k in live)
    assert not all(torch.equal(live[k], session.run.engine.policy.state("ema")[k]) for k in live)


def test_prompts_outside_the_rewards_grammar_are_refused_before_anything_is_written(tmp_path):
    from solrl_core.errors import SolrlError

    (tmp_path / "p.txt").write_text("a photo of a cat\n")
    cfg = resolve_config("tiny", sets=[f"run.run_dir={tmp_path / 'r'}", f"run.prompts={tmp_path / 'p.txt'}"])
    with pytest.raises(SolrlError, match="a photo of a cat"):
        train(cfg, ev.EventBus(), stop=StopFlag())
    assert not (tmp_path / "r").exists()
