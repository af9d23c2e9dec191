"""algorithm.loss=flow_grpo in training: the SDE rollout keeps its path and its log-probabilities, which the
update recomputes from the same inputs (ratio 1 before the step, bit for bit where the rollout runs on the
policy's own adapter); the rollouts run on the policy being trained (old decay 0); every family trains with
it; a Sol-RL + Flow-GRPO run resumes bit for bit and trains on two fsdp ranks as on one process; `solrl train
--loss flow_grpo` runs and resumes; the real presets take it; `solrl presets` lists the losses."""

from __future__ import annotations

import pytest
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.engine.sde import SdeSetting, Trajectory, sample_sde, sde_step, sde_windows
from solrl_core.errors import SolrlError
from solrl_core.loop import update
from solrl_core.plan.resolve import FLOW_GRPO_NO_COPY
from tests.conftest import FAST
from tests.helpers import (assert_adapters_close, FSDP_SETS, logged_events, saved_adapters, spawn,
                           train_recording)

SIGMAS = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])


def _velocity(x, sigma, cond):  # a smooth stand-in for a network: depends on the state, sigma and the conditioning
    return torch.tanh(x) * (1 + sigma.view(-1, 1, 1, 1)) + cond


def _noise(seeds):
    return torch.stack([torch.randn(2, 3, 3, generator=torch.Generator().manual_seed(s)) for s in seeds])


@pytest.mark.parametrize("kind", ["sde", "cps"])
def test_the_sde_rollout_keeps_its_path_and_the_log_probs_recompute_from_it(kind):
    seeds, setting = [3, 5, 8], SdeSetting(0.7, kind)
    cond = torch.tensor([0.1, -0.2, 0.3]).view(-1, 1, 1, 1)
    latents, path = sample_sde(_velocity, _noise(seeds), cond, SIGMAS, seeds, setting)
    assert path.states.shape == (3, 5, 2, 3, 3) and path.log_probs.shape == (3, 4)
    assert torch.equal(path.states[:, 0], _noise(seeds)) and torch.equal(path.states[:, -1], latents)
    for i in range(4):
        x = path.states[:, i]
        again = sde_step(x, _velocity(x, SIGMAS[i].expand(3), cond), SIGMAS, i, 0.7, kind=kind,
                         prev=path.states[:, i + 1])
        assert torch.equal(again.log_prob, path.log_probs[:, i])
    # a sample's path is its own: rolled out alone, the same bits
    alone, path1 = sample_sde(_velocity, _noise(seeds[1:2]), cond[1:2], SIGMAS, seeds[1:2], setting)
    assert torch.equal(alone, latents[1:2]) and torch.equal(path1.states, path.states[1:2])
    assert torch.equal(Trajectory.cat([path.subset(torch.tensor([0])), path1]).log_probs, path.log_probs[:2])
    # the noise differs from the ODE's: the paths are stochastic
    assert not torch.equal(sample_sde(_velocity, _noise(seeds), cond, SIGMAS, [4, 6, 9], setting)[0], latents)


def test_a_window_takes_the_sde_at_its_steps_and_the_fp32_euler_step_elsewhere():
    seeds = list(range(40))
    starts = sde_windows(seeds, 8, 2)
    assert set(starts.tolist()) == {0, 1, 2}  # Flow-GRPO-Fast's randint(0, 8 // 2 - 2), every value drawn
    assert torch.equal(sde_windows(seeds[5:9], 8, 2), starts[5:9])  # a sample's window is its own
    assert torch.equal(sde_windows(seeds, 8, 0), torch.zeros(40, dtype=torch.long))
    with pytest.raises(ValueError, match="does not fit the first half"):
        sde_windows(seeds, 8, 5)
    sigmas, pick = torch.linspace(1, 0, 9), [0, 1, 2, 3, 4, 5]
    cond = torch.linspace(-0.3, 0.3, 6).view(-1, 1, 1, 1)
    latents, path = sample_sde(_velocity, _noise(pick), cond, sigmas, pick, SdeSetting(0.7, "sde", 2))
    start = sde_windows(pick, 8, 2)
    assert torch.equal(path.start, start) and path.window == 2 and len(set(start.tolist())) > 1
    for i in range(8):
        x, nxt = path.states[:, i], path.states[:, i + 1]
        v = _velocity(x, sigmas[i].expand(6), cond)
        on = (start <= i) & (i < start + 2)
        euler = x + (sigmas[i + 1] - sigmas[i]) * v
        assert torch.equal(nxt[~on], euler[~on]) and bool(path.log_probs[~on, i].isnan().all())
        if on.any():
            again = sde_step(x[on], v[on], sigmas, i, 0.7, prev=nxt[on])
            assert torch.equal(again.log_prob, path.log_probs[on, i]) and not torch.equal(nxt[on], euler[on])
    assert path.trained_steps(6).tolist() == [[int(s), int(s) + 1] for s in start]
    assert Trajectory(path.states, path.log_probs, path.start).trained_steps(3).tolist() == [[0, 1, 2]] * 6


def _sets(run_dir, *extra):
    return [*FAST, "run.eval_prompts=", "run.iterations=2", "algorithm.loss=flow_grpo", f"run.run_dir={run_dir}",
            *extra]


def _gaps(monkeypatch):
    """|log_prob - old_log_prob| of each micro-step, and the grpo_loss calls counted."""
    gaps, real = [], update.grpo_loss

    def recording(log_prob, old_log_prob, *args, **kwargs):  # type: ignore[no-untyped-def]
        gaps.append(float((log_prob.detach() - old_log_prob).abs().max()))
        return real(log_prob, old_log_prob, *args, **kwargs)

    monkeypatch.setattr(update, "grpo_loss", recording)
    return gaps


@pytest.mark.parametrize("dtype,copy,most", [("fp32", "auto", 5e-7), ("bf16", "auto", 0.0), ("bf16", "true", None)])
def test_the_update_recomputes_the_rollouts_log_probs_before_its_step(tmp_path, monkeypatch, dtype, copy, most):
    """At iteration 1 the rollout's adapter is the trained one, so the ratio is 1 up to rounding. On the
    policy's own adapter (flow_grpo's auto: no rollout copy) bf16 gives the same bits; a merged copy's
    rounding moves the log-probabilities by more than the clip, which is why flow_grpo keeps none."""
    gaps = _gaps(monkeypatch)
    session, _ = train_recording(_sets(tmp_path, "run.iterations=1", f"run.dtype={dtype}",
                                       f"sampler.rollout_copy={copy}"))
    assert len(gaps) == 2  # 2 prompts x 4 kept = 8 samples, one micro-batch of 8, 2 of the 4 steps trained
    if most is None:
        assert max(gaps) > 1e-4
    else:
        assert max(gaps) <= most
        assert session.run.engine.rollout_copy is None and session.run.plan.machine.rollout_copy_why == \
            FLOW_GRPO_NO_COPY


def test_a_flow_grpo_run_with_a_window_trains_its_steps(tmp_path, monkeypatch):
    gaps, indices, real = _gaps(monkeypatch), [], update._path_inputs
    monkeypatch.setattr(update, "_path_inputs", lambda run, batch, chunk, index, *a: indices.append(index.tolist())
                        or real(run, batch, chunk, index, *a))
    train_recording(_sets(tmp_path, "run.iterations=1", "algorithm.sde_window=1"))
    assert len(gaps) == 1 and max(gaps) <= 5e-7  # one step a sample: one micro-step of 8
    assert set(indices[0]) <= {0, 1} and len(indices[0]) == 8


def test_two_optimizer_steps_an_iteration_each_train_half_and_the_second_sees_its_ratio_move(tmp_path, monkeypatch):
    gaps = _gaps(monkeypatch)
    session, seen = train_recording(_sets(tmp_path, "optimizer.steps_per_iteration=2"))
    steps = {int(state["step"]) for state in session.run.optimizer.state.values()}
    assert steps == {4}  # 2 iterations x 2 steps
    # each iteration: 2 micro-steps of 4 samples a step; the first step's ratio is 1, the second's has moved
    assert len(gaps) == 8 and max(gaps[0:2] + gaps[4:6]) <= 5e-7 and min(gaps[2:4] + gaps[6:8]) > 1e-5
    finished = [e for e in seen if type(e).__name__ == "IterationFinished"]
    assert len(finished) == 2 and all(e.loss["loss"] == e.loss["loss"] for e in finished)  # measured, not NaN


@pytest.mark.parametrize("setting,named", [("optimizer.steps_per_iteration=0", "optimizer.steps_per_iteration"),
                                           ("optimizer.steps_per_iteration=65", "over an iteration's 64 trained"),
                                           ("algorithm.sde_eta=0", "algorithm.sde_eta"),
                                           ("algorithm.sde_window=6", "do not fit the first half of sampler.steps=10"),
                                           ("algorithm.sde_window=-1", "algorithm.sde_window"),
                                           ("algorithm.clip_range=0", "algorithm.clip_range"),
                                           ("algorithm.sde_kind=ode", "unknown algorithm.sde_kind 'ode'"),
                                           ("algorithm.train_timesteps=stratified", "in order")])
def test_flow_grpo_settings_out_of_range_are_refused(setting, named):
    with pytest.raises(SolrlError, match=named):
        resolve_config("tiny", "sol_rl", sets=["algorithm.loss=flow_grpo", "algorithm.strata=2", setting])


@pytest.mark.slow
def test_a_sol_rl_flow_grpo_run_resumes_bit_for_bit_and_its_rollouts_follow_the_policy(tmp_path, monkeypatch):
    gaps, lanes, real_lanes = _gaps(monkeypatch), [], update._lanes
    monkeypatch.setattr(update, "_lanes", lambda run: lanes.append(real_lanes(run)) or lanes[-1])
    train_recording(_sets(tmp_path / "straight"))
    train_recording(_sets(tmp_path / "stopped"), stop_after=1)
    train_recording(_sets(tmp_path / "stopped"), resume=True)
    assert len(gaps) == 8 and max(gaps) <= 5e-7  # iteration 2 rolls out on the adapter after step 1
    for run in ("two_straight", "two_stopped"):  # two optimizer steps an iteration resume alike
        train_recording(_sets(tmp_path / run, "optimizer.steps_per_iteration=2"),
                        stop_after=1 if "stop" in run else None)
    train_recording(_sets(tmp_path / "two_stopped", "optimizer.steps_per_iteration=2"), resume=True)
    a, b = saved_adapters(tmp_path / "two_straight", 2), saved_adapters(tmp_path / "two_stopped", 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert min(lanes) > 1  # no v_old to run on the old adapter: the micro-steps side by side, with no rollout copy
    one, two = saved_adapters(tmp_path / "straight", 2), saved_adapters(tmp_path / "stopped", 2)
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    for key in [k for k in one if k.startswith("/")]:  # old decay 0: the old adapter is the trained one
        assert torch.equal(one[key], one["old" + key])
    its = [[(e["loss"], e["old_decay"]) for e in logged_events(d) if e["event"] == "iteration"]
           for d in (tmp_path / "straight", tmp_path / "stopped")]
    assert len(its[0]) == 2 and its[0] == its[1] and {decay for _, decay in its[0]} == {0.0}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["diffusionnft", "naive_scaling", "naive_quant"])
def test_the_families_without_regeneration_train_flow_grpo_on_their_sde_drafts(tmp_path, family, monkeypatch):
    gaps = _gaps(monkeypatch)
    _, seen = train_recording(_sets(tmp_path / family), family=family)
    assert [e.iteration for e in seen if type(e).__name__ == "IterationFinished"] == [1, 2]
    # naive_quant trains on its quantized drafts: their log-probabilities are the quantized copy's
    assert gaps and (max(gaps) <= 5e-7 if family != "naive_quant" else max(gaps) > 0)


@pytest.mark.slow
def test_solrl_train_with_flow_grpo_from_the_cli_and_its_resume(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from solrl_cli.app import app

    monkeypatch.chdir(tmp_path)
    args = [a for s in (*FAST, "run.eval_prompts=") for a in ("--set", s)]
    runner = CliRunner()
    straight = runner.invoke(app, ["train", *args, "--loss", "flow_grpo", "--iterations", "2", "--run-dir", "a"])
    first = runner.invoke(app, ["train", *args, "--loss", "flow_grpo", "--iterations", "1", "--run-dir", "b"])
    more = runner.invoke(app, ["train", "--resume", "b", "--iterations", "2"])
    assert straight.exit_code == first.exit_code == more.exit_code == 0, straight.output + more.output
    assert "iter    2/2" in straight.output and "iter    2/2" in more.output
    a, b = saved_adapters(tmp_path / "a", 2), saved_adapters(tmp_path / "b", 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert 'loss = "flow_grpo"' in (tmp_path / "b" / "config.toml").read_text()


def _fsdp_sets(root, run, strategy):
    return [*FSDP_SETS, "run.eval_prompts=", "run.iterations=2", "algorithm.loss=flow_grpo",
            f"run.run_dir={root / run}", f"distributed.strategy={strategy}"]


def _fsdp_worker(rank: int, world: int, port: int, root) -> None:  # type: ignore[no-untyped-def]
    import os

    from solrl_core import events as ev
    from solrl_core.loop.trainer import StopFlag, train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    assert train(resolve_config("tiny", "sol_rl", sets=_fsdp_sets(root, "two", "fsdp")), ev.EventBus(),
                 stop=StopFlag()).run.sharded


@pytest.mark.slow
def test_two_sharded_ranks_train_flow_grpo_as_one_process_does(tmp_path):
    train_recording(_fsdp_sets(tmp_path, "one", "replicate"))
    spawn(2, tmp_path, worker=_fsdp_worker)
    rewards = [[(e["draft"], e["final"]) for e in logged_events(tmp_path / d) if e["event"] == "iteration"]
               for d in ("one", "two")]
    assert len(rewards[0]) == 2 and rewards[0] == rewards[1]  # the same SDE samples, scored alike
    assert_adapters_close(saved_adapters(tmp_path / "one", 2), saved_adapters(tmp_path / "two", 2))


@pytest.mark.parametrize("model", ["sana", "flux1", "sd3"])
def test_a_real_model_takes_flow_grpo_from_the_flag_and_plans_no_merged_copy(model):
    from solrl_core.plan.resolve import resolve_plan

    cfg = resolve_config(model, "sol_rl", "imagereward", sets=["algorithm.loss=flow_grpo"])
    assert cfg.algorithm.loss == "flow_grpo" and cfg.algorithm.sde_eta == 0.7 and cfg.algorithm.clip_range == 1e-4
    machine = resolve_plan(cfg, torch.device("cpu"), "bf16").machine
    assert not machine.rollout_copy and machine.rollout_copy_why == FLOW_GRPO_NO_COPY


def test_solrl_presets_lists_every_loss():
    from typer.testing import CliRunner

    from solrl_cli.app import app
    from solrl_core.config.choices import LOSSES

    shown = CliRunner().invoke(app, ["presets"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    flat = " ".join(shown.output.split())  # the table wraps its cells to the terminal
    for name in LOSSES:
        assert f"loss {name} " in flat and f"--loss {name}" in flat, name
