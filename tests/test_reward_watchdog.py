"""A reward that hangs or raises (rewards/watchdog.py): the run stops within reward.timeout_s with a
checkpoint of the last finished iteration and one clear line, or retries and goes on unchanged.

The tiny model's reward (tinyworld_geneval) scores twice an iteration: its explore and its
regenerated samples, both before the update."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.config.schema import RewardConfig
from solrl_core.errors import SolrlError
from solrl_core.faults.manifest import verify
from solrl_core.faults.phase import phase_of
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.rewards import RewardSet
from solrl_core.rewards.timeouts import timeout_for
from solrl_core.rewards.watchdog import RewardFailure, call_watched
from tests.conftest import FAST

ROOT = Path(__file__).resolve().parents[1]
LORA = "pytorch_lora_weights.safetensors"


@pytest.fixture
def quick(fast_sets):
    return lambda *extra, run_dir="run": fast_sets("run.eval_prompts=", *extra, run_dir=run_dir)


def _train(sets):
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    try:
        return train(resolve_config("tiny", "sol_rl", sets=sets), bus, stop=StopFlag()), seen
    except SolrlError as exc:
        return exc, seen


def _spoil_reward(monkeypatch, fail):
    """The tiny world's reward, raising where fail(call_number) is true."""
    from solrl_core.rewards.tinyworld import TinyWorldReward

    real_call, calls = TinyWorldReward.__call__, []

    def call(self, images, prompts):
        calls.append(len(prompts))
        if fail(len(calls)):
            raise RuntimeError(f"reward server said 503 (call {len(calls)})")
        return real_call(self, images, prompts)
    monkeypatch.setattr(TinyWorldReward, "__call__", call)
    return calls


# ---------------------------------------------------------------- a real hang, through the CLI

_HANG = textwrap.dedent("""
    import sys, time
    from solrl_core.rewards.tinyworld import TinyWorldReward

    real_call, calls, hang_after = TinyWorldReward.__call__, [], int(sys.argv[1])

    def call(self, images, prompts):
        calls.append(1)
        if len(calls) > hang_after:
            time.sleep(10**6)  # a reward model that never answers
        return real_call(self, images, prompts)

    TinyWorldReward.__call__ = call
    from solrl_cli.app import main

    sys.argv = ["solrl", *sys.argv[2:]]
    main()
""")


def _solrl(script, hang_after, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOLRL_DEBUG": ""}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script), str(hang_after), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"solrl {' '.join(args[:1])} still running after 120 s:\n{out[-2000:]}")
    return proc.returncode, out, time.monotonic() - t0


def test_a_hung_reward_stops_the_cli_with_a_checkpoint_that_resumes(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(_HANG)
    run_dir = tmp_path / "run"
    sets = [a for s in (*FAST, "run.eval_prompts=", f"run.run_dir={run_dir}", "reward.timeout_s=2")
            for a in ("--set", s)]
    code, out, _ = _solrl(script, 2, "train", *sets, "--iterations", "3")  # iteration 2's first scoring hangs
    assert code == 2, out
    assert "error: reward 'tinyworld_geneval' did not finish scoring a batch within reward.timeout_s=2 s" in out
    assert "fix: raise reward.timeout_s, or 0 to turn the watchdog off" in out
    assert "Traceback" not in out and "internal error" not in out
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_000001"]
    assert verify(ckpts / "iter_000001") is None

    code, out, _ = _solrl(script, 10**6, "train", "--resume", str(run_dir), "--iterations", "2")
    assert code == 0, out
    assert "resuming at iteration 1" in out
    assert verify(ckpts / "iter_000002") is None


# ---------------------------------------------------------------- a reward that raises


def test_a_reward_that_raises_once_is_retried_and_the_run_equals_an_untouched_one(quick, monkeypatch):
    straight, _ = _train(quick("run.iterations=2", run_dir="a"))
    calls = _spoil_reward(monkeypatch, lambda n: n == 3)  # iteration 2's explore scoring, once
    retried, seen = _train(quick("run.iterations=2", run_dir="b"))
    assert not isinstance(retried, Exception), retried
    assert len(calls) == 5
    assert retried.state.history == straight.state.history
    for which in ("default", "old", "ema"):
        x, y = straight.run.engine.policy.state(which), retried.run.engine.policy.state(which)
        assert all(torch.equal(x[k], y[k]) for k in x), which
    warnings = [e.message for e in seen if isinstance(e, ev.RunWarning)]
    assert warnings == ["reward 'tinyworld_geneval' raised RuntimeError: reward server said 503 (call 3); trying again "
                        "(1 of 1)"]


def test_a_reward_that_keeps_raising_stops_with_a_checkpoint_of_the_last_finished_iteration(quick, monkeypatch):
    straight, _ = _train(quick("run.iterations=1", run_dir="a"))
    _spoil_reward(monkeypatch, lambda n: n > 2)  # every scoring of iteration 2 on
    failed, seen = _train(quick("run.iterations=3", run_dir="b"))
    assert isinstance(failed, RewardFailure) and failed.reward == "tinyworld_geneval"
    assert (failed.message == "reward 'tinyworld_geneval' failed (2 tries): RuntimeError: reward server said 503 (call "
                              "4)")
    assert "--resume" in failed.fix
    assert [e.reason for e in seen if isinstance(e, ev.RunFinished)] == ["failed"]
    saved = Path(resolve_config("tiny", sets=quick(run_dir="b")).run.run_dir) / "checkpoints"
    assert sorted(p.name for p in saved.iterdir()) == ["iter_000001"] and verify(saved / "iter_000001") is None
    reference = straight.run.run_dir / "checkpoints" / "iter_000001"
    for part in ("", "old/", "ema/"):  # the weights of iteration 1, untouched by the failed iteration 2
        a, b = load_file(str(reference / f"{part}{LORA}")), load_file(str(saved / "iter_000001" / f"{part}{LORA}"))
        assert all(torch.equal(a[k], b[k]) for k in a), part
    a, b = (json.loads((folder / "trainer_state.json").read_text()) for folder in (reference, saved / "iter_000001"))
    assert a.pop("seconds") > 0 and b.pop("seconds") > 0 and a == b  # the same state; each run's own clock


def test_a_reward_failing_in_an_evaluation_saves_the_iteration_just_finished(quick, monkeypatch, tmp_path):
    (tmp_path / "eval.txt").write_text("a blue circle below a yellow triangle\n")
    straight, _ = _train(quick("run.iterations=1", run_dir="a"))
    calls = _spoil_reward(monkeypatch, lambda n: n >= 4)  # base evaluation, iteration 1 (2), then the EMA evaluation
    failed, seen = _train(quick("run.iterations=1", f"run.eval_prompts={tmp_path / 'eval.txt'}", "run.eval_seeds=1",
                                "run.checkpoint_every=100", run_dir="b"))
    assert isinstance(failed, RewardFailure) and len(calls) == 5 and calls[0] == calls[-1] == 1
    assert [e.weights for e in seen if isinstance(e, ev.EvalFinished)] == ["base"]
    assert [Path(e.path).name for e in seen if isinstance(e, ev.CheckpointSaved)] == ["iter_000001"]
    reference, saved = (straight.run.run_dir / "checkpoints" / "iter_000001",
                        tmp_path / "b" / "checkpoints" / "iter_000001")
    assert verify(saved) is None
    for part in ("", "old/", "ema/"):  # the EMA was swapped back before scoring: the trained weights are saved
        a, b = load_file(str(reference / f"{part}{LORA}")), load_file(str(saved / f"{part}{LORA}"))
        assert all(torch.equal(a[k], b[k]) for k in a), part


def test_a_reward_with_no_retries_stops_at_its_first_error(quick, monkeypatch):
    calls = _spoil_reward(monkeypatch, lambda n: True)
    failed, _ = _train(quick("run.iterations=1", "reward.retries=0"))
    assert isinstance(failed, RewardFailure) and len(calls) == 1
    assert failed.message == "reward 'tinyworld_geneval' failed: RuntimeError: reward server said 503 (call 1)"


# ---------------------------------------------------------------- the watchdog itself


def test_watched_scores_are_bit_identical_and_see_the_callers_grad_and_autocast_state():
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    prompts = ["a red circle"] * 6
    weights = {"jpeg_compressibility": 1.0, "tinyworld_geneval": 0.5}
    plain, watched = RewardSet(weights), RewardSet(weights, timeout_s="30")
    assert watched.timeouts == {"jpeg_compressibility": 30.0, "tinyworld_geneval": 30.0}
    a, b = plain(images, prompts), watched(images, prompts)
    assert torch.equal(a.total, b.total) and all(torch.equal(a.components[k], b.components[k]) for k in a.components)

    def state():
        return torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert call_watched("probe", state, 30, 0) == state() == (False, True, torch.bfloat16)
    assert call_watched("probe", state, 30, 0) == state()


def test_an_oom_passes_the_watchdog_unchanged_and_untried_again():
    calls = []

    def oom():
        calls.append(1)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (reward model)")
    error = torch.cuda.OutOfMemoryError
    with pytest.raises(error):
        call_watched("imagereward", oom, 30, 3)
    assert len(calls) == 1
    rewards = RewardSet({"tinyworld_geneval": 1.0}, timeout_s="30", retries=3)
    rewards.rewards["tinyworld_geneval"] = lambda images, prompts: oom()
    with pytest.raises(error) as info:
        rewards(torch.rand(1, 3, 8, 8), ["x"])
    # charged to the reward phase: backoff.py halves its batch
    assert phase_of(info.value) == "reward" and len(calls) == 2


def test_a_keyboard_interrupt_is_not_retried():
    calls = []

    def interrupted():
        calls.append(1)
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        call_watched("pickscore", interrupted, 30, 3)
    with pytest.raises(KeyboardInterrupt):
        call_watched("pickscore", interrupted, 0, 3)
    assert len(calls) == 2


def test_a_hang_in_process_is_cut_at_the_timeout():
    finished = threading.Event()

    def hang() -> None:
        time.sleep(60)
        finished.set()
    with pytest.raises(RewardFailure) as info:
        call_watched("hpsv2", hang, 0.2, 3)  # a timeout is not retried: the first call still runs
    assert not finished.is_set()  # cut while the call still hangs, not after it returned
    assert info.value.message == "reward 'hpsv2' did not finish scoring a batch within reward.timeout_s=0.2 s"


def test_auto_watches_the_model_rewards_only_and_the_setting_is_checked():
    assert timeout_for("auto", model_reward=True) == 600.0 and timeout_for("auto", model_reward=False) == 0.0
    assert timeout_for("0", model_reward=True) == 0.0 and timeout_for("2.5", model_reward=False) == 2.5
    assert RewardSet({"jpeg_compressibility": 1.0}, timeout_s="auto").timeouts == {"jpeg_compressibility": 0.0}
    assert RewardConfig().timeout_s == "auto" and RewardConfig().retries == 1
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(SolrlError, match="reward.timeout_s=.* must be auto or a number of seconds >= 0"):
            resolve_config("tiny", sets=[f"reward.timeout_s={bad}"]).validate()
    with pytest.raises(SolrlError, match="reward.retries=-1 is out of range: it must be >= 0"):
        resolve_config("tiny", sets=["reward.retries=-1"]).validate()
    assert resolve_config("tiny", sets=["reward.timeout_s=30"]).validate().reward.timeout_s == "30"


def test_a_reward_refusing_its_input_names_its_reason_and_its_fix_once():
    def refuse() -> float:
        raise SolrlError("reward 'w' cannot judge prompt 0 ('a cat')", "use captions of the tiny world")

    with pytest.raises(RewardFailure) as failed:
        call_watched("w", refuse, 0, retries=1)
    assert failed.value.message == "reward 'w' failed (2 tries): reward 'w' cannot judge prompt 0 ('a cat')"
    assert failed.value.fix == "use captions of the tiny world"  # was also inside the message, printed twice
