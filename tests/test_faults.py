"""Faults a long run meets, injected where they happen for real, on the tiny model (solrl_core/faults).

Each test checks that the run goes on or stops as documented, and that nothing is lost: where the
fault did not change the run's inputs, the run equals one the fault never touched."""

import contextlib
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from solrl_core import events as ev
from solrl_core.config.convert import load_run_config
from solrl_core.config.presets import resolve_config
from solrl_core.engine import checkpoint as ckpt
from solrl_core.errors import SolrlError
from solrl_core.faults.manifest import MANIFEST, verify
from solrl_core.loop.session import open_session
from solrl_core.loop.trainer import StopFlag, train
from tests.helpers import of_kind as _of, train_or_error as _train

LORA = "pytorch_lora_weights.safetensors"


@pytest.fixture
def quick(fast_sets):
    """fast_sets without the tiny preset's held-out evaluations (256 images each): no test here needs them."""
    return lambda *extra, run_dir="run": fast_sets("run.eval_prompts=", *extra, run_dir=run_dir)


def _same_run(a, b, atol=0.0):
    assert a.state.history == pytest.approx(b.state.history, abs=atol, rel=0)
    for which in ("default", "old", "ema"):
        x, y = a.run.engine.policy.state(which), b.run.engine.policy.state(which)
        assert all(torch.allclose(x[k], y[k], rtol=0, atol=atol) for k in x), which


# ---------------------------------------------------------------- checkpoints you can trust


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # inside the last tensor's data: the header still parses
    path.write_bytes(bytes(data))


def _losses(seen, after=0):
    """Reward, loss and gradient norm of each iteration past `after`, in order."""
    return [x for e in _of(seen, ev.IterationFinished) if e.iteration > after
            for x in (e.final.mean, e.loss["loss"], e.grad_norm)]


def test_a_damaged_newest_checkpoint_is_refused_and_an_older_one_resumes(quick):
    sets = quick("run.iterations=3", "run.checkpoint_every=1", "run.keep_checkpoints=3", run_dir="r")
    straight, seen = _train(sets)
    ckpts = straight.run.run_dir / "checkpoints"
    final = {k: v.clone() for k, v in straight.run.engine.policy.state("default").items()}
    (ckpts / "iter_000003" / "ema" / LORA).write_bytes((ckpts / "iter_000003" / "ema" / LORA).read_bytes()[:-100])
    refused, _ = _train(sets, resume=True)
    assert isinstance(refused, SolrlError)
    assert refused.message.startswith(f"checkpoint iter_000003 is torn or corrupt (ema/{LORA}: truncated")
    assert "newest intact: iter_000002" in refused.message and "--checkpoint iter_000002" in refused.fix

    _flip_a_byte(ckpts / "iter_000002" / "old" / LORA)
    load_file(str(ckpts / "iter_000002" / "old" / LORA))  # the flipped file still loads: only the checksum tells
    refused, _ = _train(sets, resume=True, checkpoint="iter_000002")
    assert isinstance(refused, SolrlError)
    assert f"old/{LORA}: checksum mismatch" in refused.message and "newest intact: iter_000001" in refused.message

    resumed, again = _train(sets, resume=True, checkpoint="iter_000001")
    assert [e.iteration for e in _of(again, ev.IterationFinished)] == [2, 3]
    assert _losses(again) == pytest.approx(_losses(seen, after=1), abs=1e-6)
    assert resumed.state.history == pytest.approx(straight.state.history, abs=1e-6)
    now = resumed.run.engine.policy.state("default")
    assert all(torch.allclose(final[k], now[k], rtol=0, atol=1e-6) for k in final)
    names = sorted(p.name for p in ckpts.iterdir())
    assert names[:3] == ["iter_000001", "iter_000002", "iter_000003"] and len(names) == 5
    assert all(n.startswith("superseded-iter_00000") for n in names[3:])  # the damaged ones, kept aside
    assert all(verify(ckpts / n) is None for n in names[:3])


def test_a_checkpoint_without_its_manifest_is_torn(quick):
    sets = quick("run.iterations=1")
    session, _ = _train(sets)
    (session.run.run_dir / "checkpoints" / "iter_000001" / MANIFEST).unlink()
    refused, _ = _train(sets, resume=True)
    assert isinstance(refused, SolrlError) and f"{MANIFEST}: missing" in refused.message
    assert "newest intact: none" in refused.message


def test_a_full_disk_leaves_the_previous_checkpoint_and_stops_clearly(quick, monkeypatch):
    real_save, saves = ckpt.save_state, []

    def save(obj, folder, name):
        saves.append(name)
        if len(saves) == 3:  # the optimizer state of the second checkpoint
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, folder, name)

    monkeypatch.setattr(ckpt, "save_state", save)
    sets = quick("run.iterations=2", "run.checkpoint_every=1", run_dir="r")
    failed, seen = _train(sets)
    monkeypatch.setattr(ckpt, "save_state", real_save)
    assert isinstance(failed, SolrlError)
    assert ("disk is full" in failed.message and "iter_000002" in failed.message
            and "iter_000001 is intact" in failed.message)
    assert _of(seen, ev.RunFinished)[0].reason == "failed"
    ckpts = Path(resolve_config("tiny", sets=sets).run.run_dir) / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_000001"]  # no half-written folder left
    assert verify(ckpts / "iter_000001") is None
    resumed, again = _train(sets, resume=True)  # iteration 2 again, from the intact checkpoint: the same numbers
    assert _losses(again) == pytest.approx(_losses(seen, after=1), abs=1e-6)


# ---------------------------------------------------------------- one writer per run folder


_HOLD = ("import sys, time; from solrl_core.faults.lock import RunLock; lock = RunLock.acquire(sys.argv[1]); "
         "print('locked', flush=True); time.sleep(120)")


def test_a_live_writer_blocks_a_second_run_and_a_killed_one_does_not(quick):
    sets = quick("run.iterations=2", run_dir="r")
    first, _ = _train(quick("run.iterations=1", run_dir="r"))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(first.run.run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for resume in (True, False):  # --resume, and a fresh train on the same folder
            refused, _ = _train(sets, resume=resume)
            assert isinstance(refused, SolrlError), resume
            assert f"being written by another solrl run (process {holder.pid} on " in refused.message
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the lock file stays behind
        holder.wait()
    assert (first.run.run_dir / "solrl.lock").exists()
    resumed, seen = _train(sets, resume=True)
    assert [e.iteration for e in _of(seen, ev.IterationFinished)] == [2]


def test_two_sessions_in_one_process_cannot_share_a_folder(quick):
    sets = quick("run.iterations=1", run_dir="r")
    session = open_session(resolve_config("tiny", "sol_rl", sets=sets))
    with pytest.raises(SolrlError, match="being written by another solrl run"):
        open_session(resolve_config("tiny", "sol_rl", sets=sets))
    session.run.lock.release()
    # free now, and nothing was saved: it starts again
    again = open_session(resolve_config("tiny", "sol_rl", sets=sets))
    assert again.state.iteration == 0 and not again.state.resumed
    again.run.lock.release()


# ---------------------------------------------------------------- out-of-memory back-off


def _oom_above(limit, calls):
    def check(n):
        calls.append(n)
        if n > limit:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate a batch of {n}")
    return check


def test_an_oom_in_the_rollout_halves_its_batch_and_equals_a_run_at_that_size(quick, monkeypatch):
    import solrl_core.engine.sampler as rollout

    # one batch at a time (run.lanes=false): in a CPU's lanes a second batch is in flight when the first fails
    straight, _ = _train(quick("run.iterations=1", "sampler.rollout_batch=4", "run.lanes=false", run_dir="straight"))
    calls, real_sample = [], rollout.sample
    check = _oom_above(4, calls)  # the "GPU" holds 4 samples per forward batch

    def sample(velocity, noise, *args, **kwargs):
        check(noise.shape[0])
        return real_sample(velocity, noise, *args, **kwargs)

    monkeypatch.setattr(rollout, "sample", sample)
    # 8: one prompt group of explore.group_size=8 per Stage-1 batch (batches never mix two groups)
    session, seen = _train(quick("run.iterations=1", "sampler.rollout_batch=8", "run.lanes=false", run_dir="r"))
    backoffs = _of(seen, ev.OutOfMemoryBackoff)
    assert [(b.iteration, b.phase, b.setting, b.old, b.new)
            for b in backoffs] == [(1, "rollout", "sampler.rollout_batch", 8, 4)]
    assert calls[0] == 8 and max(calls[1:]) == 4  # one failure, then every batch fit
    # The same draws at any batch size: equal up to the last bits of a differently batched matmul.
    _same_run(straight, session, atol=1e-6)
    assert load_run_config(session.run.run_dir).sampler.rollout_batch == 4  # a resume keeps the smaller size
    lines = [json.loads(x) for x in (session.run.run_dir / "events.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines].count("oom_backoff") == 1


def test_an_oom_in_the_update_halves_the_micro_batch(quick, monkeypatch):
    import solrl_core.loop.update as update

    straight, _ = _train(quick("run.iterations=1", "optimizer.micro_batch=4", run_dir="straight"))
    calls, real_loss = [], update.nft_loss
    check = _oom_above(4, calls)

    def nft_loss(v, *args, **kwargs):
        check(v.shape[0])
        return real_loss(v, *args, **kwargs)

    monkeypatch.setattr(update, "nft_loss", nft_loss)
    session, seen = _train(quick("run.iterations=1", "optimizer.micro_batch=8", run_dir="r"))
    assert [(b.phase, b.old, b.new) for b in _of(seen, ev.OutOfMemoryBackoff)] == [("update", 8, 4)]
    _same_run(straight, session, atol=1e-6)


def test_an_oom_in_reward_scoring_halves_the_reward_batch(quick, monkeypatch):
    from solrl_core.rewards.tinyworld import TinyWorldReward

    real_call, calls = TinyWorldReward.__call__, []

    def call(self, images, prompts):
        calls.append(len(prompts))
        if len(calls) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (reward model)")
        return real_call(self, images, prompts)

    monkeypatch.setattr(TinyWorldReward, "__call__", call)
    session, seen = _train(quick("run.iterations=1", run_dir="r"))
    assert [(b.phase, b.setting, b.old, b.new)
            for b in _of(seen, ev.OutOfMemoryBackoff)] == [("reward", "reward.batch_size", 32, 16)]
    assert session.state.iteration == 1 and load_run_config(session.run.run_dir).reward.batch_size == 16


def test_an_oom_at_batch_one_stops_with_a_checkpoint_and_says_what_to_change(quick, monkeypatch):
    import solrl_core.engine.sampler as rollout

    after_first = {"on": False}
    real_sample = rollout.sample

    def sample(*args, **kwargs):
        if after_first["on"]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real_sample(*args, **kwargs)

    monkeypatch.setattr(rollout, "sample", sample)
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    bus.subscribe(lambda e: after_first.update(on=True) if isinstance(e, ev.IterationFinished) else None)
    cfg = resolve_config("tiny", "sol_rl", sets=quick("run.iterations=3", "sampler.rollout_batch=4"))
    with pytest.raises(SolrlError) as info:
        train(cfg, bus, stop=StopFlag())
    assert "out of GPU memory in the rollout even at sampler.rollout_batch=1" in info.value.message
    assert "model.resolution" in info.value.fix and "--resume" in info.value.fix
    assert [(b.old, b.new) for b in _of(seen, ev.OutOfMemoryBackoff)] == [(4, 2), (2, 1)]
    saved = [e.path for e in _of(seen, ev.CheckpointSaved)]
    assert len(saved) == 1 and saved[0].endswith("iter_000001")


# ---------------------------------------------------------------- rewards and steps that go wrong


def _nan_reward(monkeypatch, spoil):
    """The tiny world's reward, with spoil(call_number, scores) putting NaN into some of its scores."""
    from solrl_core.rewards.tinyworld import TinyWorldReward

    real_call, calls = TinyWorldReward.__call__, []

    def call(self, images, prompts):
        out = real_call(self, images, prompts).clone()
        calls.append(len(prompts))
        spoil(len(calls), out)
        return out
    monkeypatch.setattr(TinyWorldReward, "__call__", call)


def _update_sizes(monkeypatch):
    import solrl_core.loop.stages as stages

    sizes, real_update = [], stages.update

    def update(run, batch, *args, **kwargs):
        sizes.append(len(batch.prompts))
        return real_update(run, batch, *args, **kwargs)
    monkeypatch.setattr(stages, "update", update)
    return sizes


def test_nan_rewards_drop_their_samples_then_a_group_then_stop_the_run(quick, monkeypatch):
    # One call per stage: 16 drafts (2 groups of 8), then 8 finals (2 groups of 4) per iteration.
    def spoil(call, out):
        iteration = (call + 1) // 2
        if iteration == 1:
            out[:2] = float("nan")  # some images: two of group 0
        elif iteration == 2:
            out[: len(out) // 2] = float("inf")  # all of group 0
        else:
            out[:] = float("nan")  # every image

    import solrl_core.rewards.health as health

    monkeypatch.setattr(health, "near_constant", lambda *args: None)  # only the non-finite streak may stop this run
    _nan_reward(monkeypatch, spoil)
    sizes = _update_sizes(monkeypatch)
    sets = quick("run.iterations=6", "run.checkpoint_every=1", "run.keep_checkpoints=10", "reward.health_patience=2")
    failed, seen = _train(sets)
    assert isinstance(failed, SolrlError)
    assert "reward 'tinyworld_geneval' returned NaN or infinity for every image 2 iterations in a row" in failed.message
    drops = [(e.iteration, e.stage, e.rewards, e.dropped, e.groups_skipped) for e in _of(seen, ev.SamplesDropped)]
    name = "tinyworld_geneval"
    assert drops == [(1, "explore", {name: 2}, 2, 0), (1, "final", {name: 2}, 2, 0),
                     (2, "explore", {name: 8}, 8, 1), (2, "final", {name: 4}, 4, 1),
                     (3, "explore", {name: 16}, 16, 2), (3, "final", {name: 8}, 8, 2),
                     (4, "explore", {name: 16}, 16, 2), (4, "final", {name: 8}, 8, 2)]
    assert sizes == [6, 4]  # the dropped samples never reached the update; iterations 3 and 4 made no step
    its = _of(seen, ev.IterationFinished)
    assert [e.iteration for e in its] == [1, 2, 3,
                                          4] and all(torch.isfinite(torch.tensor(e.final.mean)) for e in its[:2])
    ckpts = resolve_config("tiny", sets=sets).run.run_dir + "/checkpoints"
    two, four = (load_file(f"{ckpts}/iter_00000{i}/{LORA}") for i in (2, 4))
    assert all(torch.equal(two[k], four[k]) for k in two)  # no step without a finite reward
    assert all(torch.isfinite(v).all() for v in four.values())


def _nan_gradient(monkeypatch, bad_iterations):
    """The NFT loss plus a term worth 0 whose gradient is NaN, in the listed iterations."""
    import solrl_core.loop.update as update

    real_loss, state = update.nft_loss, {"iteration": 1}

    def nft_loss(v, *args, **kwargs):
        terms = real_loss(v, *args, **kwargs)
        if state["iteration"] in bad_iterations:
            poison = torch.where(torch.tensor(False), torch.sqrt(-(v ** 2).mean() - 1), torch.tensor(0.0))
            terms = type(terms)(terms.loss + poison, terms.policy, terms.kl, terms.nonfinite)
        return terms
    monkeypatch.setattr(update, "nft_loss", nft_loss)
    return lambda e: state.update(iteration=e.iteration + 1) if isinstance(e, ev.IterationFinished) else None


def test_a_nan_gradient_skips_the_step_and_enough_in_a_row_stop_the_run(quick, monkeypatch):
    advance = _nan_gradient(monkeypatch, {1, 3, 4})
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    bus.subscribe(advance)
    cfg = resolve_config("tiny", "sol_rl", sets=quick("run.iterations=6", "optimizer.max_nonfinite_steps=2"))
    with pytest.raises(SolrlError, match="2 optimizer steps in a row were skipped"):
        train(cfg, bus, stop=StopFlag())
    skipped = [(e.iteration, e.reason, e.in_a_row) for e in _of(seen, ev.StepSkipped)]
    reason = "gradient norm not finite"
    assert skipped == [(1, reason, 1), (3, reason, 1), (4, reason, 2)]  # iteration 2 stepped: the count starts again
    assert [e.path[-6:] for e in _of(seen, ev.CheckpointSaved)] == ["000004"]
    saved = Path(cfg.run.run_dir) / "checkpoints" / "iter_000004"
    state = json.loads((saved / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["faults"]["skipped_steps"] == 2
    assert all(torch.isfinite(v).all() for v in load_file(str(saved / LORA)).values())  # no NaN reached the weights


# ---------------------------------------------------------------- the pieces alone


def test_the_manifest_names_the_first_bad_file(tmp_path):
    from solrl_core.faults.manifest import write_manifest

    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"\x00" * 64)
    (tmp_path / "sub" / "b.bin").write_bytes(bytes(range(64)))
    write_manifest(tmp_path)
    assert verify(tmp_path) is None
    _flip_a_byte(tmp_path / "sub" / "b.bin")
    assert str(verify(tmp_path)) == "sub/b.bin: checksum mismatch (the file is corrupt)"
    (tmp_path / "a.bin").write_bytes(b"\x00" * 60)
    assert str(verify(tmp_path)) == "a.bin: truncated or overwritten: 60 bytes, 64 expected"
    (tmp_path / "a.bin").unlink()
    assert str(verify(tmp_path)) == "a.bin: missing"


def test_an_oom_is_charged_to_the_innermost_phase_it_passed_through():
    from solrl_core.faults.phase import charged_to, phase_of

    def raised_in(*phases):
        """An out-of-memory error raised inside the nested phases (outermost first)."""
        try:
            with contextlib.ExitStack() as stack:
                for phase in phases:
                    stack.enter_context(charged_to(phase))
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        except torch.cuda.OutOfMemoryError as exc:
            return phase_of(exc)

    assert raised_in("rollout") == "rollout"
    assert raised_in("evaluation", "rollout", "reward") == "reward"
    assert raised_in("update") == "update"
    assert raised_in("evaluation") == "evaluation"
    assert raised_in() is None  # outside every phase there is no batch to halve: the error stands
    with pytest.raises(ValueError, match="no out-of-memory phase 'sync'"):
        raised_in("sync")


def test_each_phase_names_itself_where_it_runs(quick, monkeypatch):
    """The real rollout, reward and update code charge an error raised inside them to their phase."""
    import solrl_core.engine.sampler as sampler
    from solrl_core.faults.phase import phase_of
    from solrl_core.rewards.tinyworld import TinyWorldReward

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    for target, name, phase in ((sampler, "sample", "rollout"), (TinyWorldReward, "__call__", "reward")):
        with monkeypatch.context() as patch:
            patch.setattr(target, name, oom)
            session = open_session(resolve_config("tiny", "sol_rl", sets=quick(run_dir=phase)))
            try:
                with pytest.raises(torch.cuda.OutOfMemoryError) as info:
                    from solrl_core.loop.trainer import run_iteration

                    run_iteration(session.run, session.state, ev.EventBus())
                assert phase_of(info.value) == phase
            finally:
                session.run.lock.release()


def test_every_view_shows_a_survived_fault_as_a_warning():
    import io

    from rich.console import Console

    from solrl_view.display import TerminalDisplay
    from solrl_cli.tui.state import RunState

    faults = [ev.OutOfMemoryBackoff(iteration=3, phase="rollout", setting="sampler.rollout_batch", old=24, new=12),
              ev.SamplesDropped(iteration=4, stage="final", rewards={"pickscore": 3}, dropped=3, samples=96,
                                groups_skipped=1, groups=4),
              ev.StepSkipped(iteration=5, reason="gradient norm not finite", in_a_row=1, limit=5)]
    out = io.StringIO()
    display, state = TerminalDisplay(Console(file=out, width=200)), RunState()
    for e in faults:
        display(e)
        state.apply(json.loads(json.dumps(e.to_dict())))
    text = out.getvalue()
    assert "sampler.rollout_batch 24 -> 12" in text and "'pickscore' 3; 3 of 96 samples left out of the update" in text
    assert "1 of 4 prompt groups skipped" in text and "skipped: gradient norm not finite, 1 in a row" in text
    assert state.warning_count == 3 and "out of GPU memory in the rollout" in state.warnings[0]["message"]
