"""A stop request while a reward hangs (solrl_core/rewards/watchdog.py, stopping.py): the scoring call
is abandoned within a few seconds of the request, the last finished iteration is saved and the run
stops as any stop does, whether or not the reward has a time limit of its own.

The tiny model's reward (tinyworld_geneval) has no watchdog limit by default (reward.timeout_s auto
is none for it), so before this a hang held the run through every first signal."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine.checkpoint import list_checkpoints
from solrl_core.faults.manifest import verify
from solrl_core.loop.trainer import train
from solrl_core.rewards.watchdog import STOP_GRACE_S, call_watched
from solrl_core.runtime.stopping import ScoringAbandoned, StopFlag
from tests.conftest import FAST

ROOT = Path(__file__).resolve().parents[1]

# `solrl train` whose reward's call number HANG_AT (1-based) never returns; it says so on stderr first.
_HANG = textwrap.dedent("""
    import sys, threading
    from solrl_core.rewards.tinyworld import TinyWorldReward

    real_call, calls, hang_at = TinyWorldReward.__call__, [], int(sys.argv[1])

    def call(self, images, prompts):
        calls.append(1)
        if len(calls) == hang_at:
            print("REWARD HUNG", file=sys.stderr, flush=True)
            threading.Event().wait()  # a reward model or server that never answers
        return real_call(self, images, prompts)

    TinyWorldReward.__call__ = call
    from solrl_cli.app import main

    sys.argv = ["solrl", *sys.argv[2:]]
    main()
""")


def _start(tmp_path, hang_at, *args):
    script = tmp_path / "hang.py"
    script.write_text(_HANG)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOLRL_DEBUG": "", "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, str(script), str(hang_at), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)


def _finish(proc, limit):
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"still running {limit} s later:\n{out[-3000:]}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_ends_a_hung_reward_within_seconds_saves_and_resumes(tmp_path, sig):
    run_dir = tmp_path / "run"
    sets = [a for s in (*FAST, "run.eval_prompts=", f"run.run_dir={run_dir}") for a in ("--set", s)]
    # calls 1-2: iteration 1; call 3: iteration 2's drafts
    proc = _start(tmp_path, 3, "train", *sets, "--iterations", "3")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("REWARD HUNG"):
            time.sleep(0.5)  # hung for a while, as a real one would be
            proc.send_signal(sig)
            asked = time.monotonic()
            break
    else:
        pytest.fail("".join(lines))
    out = "".join(lines) + _finish(proc, 60)
    took = time.monotonic() - asked
    assert proc.returncode == 130, out  # a stop, not a failure or a kill
    # the grace, then one checkpoint of the tiny model and exit (about 5 s on 2 idle cores; bounded
    # loosely for a loaded machine: before, the run never ended)
    assert took < STOP_GRACE_S + 30, (took, out)
    assert "Traceback" not in out and "internal error" not in out
    if sig != signal.SIGHUP:  # SIGHUP sends the output to /dev/null: the terminal is gone
        assert "reward 'tinyworld_geneval' was still scoring" in out and "iteration 2 abandoned" in out, out
        assert f"stopped after iteration 1; `solrl train --resume {run_dir}` continues from iter_000001" in out, out
    saved = list_checkpoints(run_dir)
    assert [p.name for p in saved] == ["iter_000001"] and verify(saved[0]) is None
    records = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["reason"] for e in records if e["event"] == "run_finished"] == ["interrupted"]

    if sig == signal.SIGTERM:  # the run goes on from there (no hang this time), lock released
        proc = _start(tmp_path, 10**6, "train", "--resume", str(run_dir), "--iterations", "2")
        out = _finish(proc, 120)
        assert proc.returncode == 0, out
        assert "resuming at iteration 1" in out and verify(run_dir / "checkpoints" / "iter_000002") is None


def test_a_stop_abandons_a_hung_call_after_the_grace_and_lets_a_slow_one_finish():
    flag, release, asked = StopFlag(), threading.Event(), []
    threading.Timer(0.3, lambda: asked.append(time.monotonic()) or flag.request("SIGTERM")).start()
    with pytest.raises(ScoringAbandoned) as info:  # unwatched (timeout 0), not retried: still abandoned
        call_watched("tinyworld_geneval", release.wait, 0, 3, stop=lambda: flag.requested)
    took = time.monotonic() - asked[0]
    release.set()
    # never before the grace (the watchdog sees the request no earlier than it is made); after it, bounded
    # loosely for a loaded machine: the call itself never returns
    assert STOP_GRACE_S <= took < STOP_GRACE_S + 30, took
    assert "reward 'tinyworld_geneval' was still scoring" in info.value.message

    flag = StopFlag()
    flag.request("Ctrl-C")  # asked before the call: a call that ends within the grace is kept
    assert call_watched("jpeg_compressibility", lambda: time.sleep(0.5) or 7, 0, 0, stop=lambda: flag.requested) == 7


@pytest.mark.slow
def test_a_stop_while_an_evaluation_hangs_saves_the_iteration_just_finished(tmp_path, monkeypatch):
    from solrl_core.rewards.tinyworld import TinyWorldReward

    (tmp_path / "eval.txt").write_text("a red circle\n")
    real_call, calls, flag, release, asked = TinyWorldReward.__call__, [], StopFlag(), threading.Event(), []

    def request():
        asked.append(time.monotonic())
        flag.request("SIGTERM", True)

    def call(self, images, prompts):
        calls.append(1)
        if len(calls) == 4:  # the base evaluation, iteration 1's two scorings, then its evaluation
            threading.Timer(0.2, request).start()
            release.wait(60)
        return real_call(self, images, prompts)
    monkeypatch.setattr(TinyWorldReward, "__call__", call)
    sets = [*FAST, f"run.run_dir={tmp_path / 'run'}", f"run.eval_prompts={tmp_path / 'eval.txt'}", "run.iterations=3",
            "run.eval_every=1"]
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    try:
        session = train(resolve_config("tiny", "sol_rl", sets=sets), bus, stop=flag)
    finally:
        ended = time.monotonic()
        release.set()
    assert ended - asked[0] < STOP_GRACE_S + 20  # the grace and a checkpoint, not the hung call's 60 s
    assert session.state.iteration == 1
    assert [p.name for p in list_checkpoints(session.run.run_dir)] == ["iter_000001"]
    assert [e.reason for e in seen if isinstance(e, ev.RunFinished)] == ["interrupted"]
    assert any("was still scoring" in e.message for e in seen if isinstance(e, ev.RunWarning))
