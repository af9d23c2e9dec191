"""Stopping a run and starting it again (solrl_core/runtime/stopping.py): real signals to a real `solrl
train` process, a stop at a phase boundary, a run stopped before its first checkpoint, a stop during
an evaluation (of a run, or `solrl eval`), and a resume from an older checkpoint that fails before it
is committed."""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from solrl_view.display import TerminalDisplay
from solrl_view.stop_text import finished_message, stop_message
from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine.checkpoint import list_checkpoints
from solrl_core.errors import SolrlError
from solrl_core.faults.manifest import verify
from solrl_core.loop.trainer import train
from solrl_core.runtime.stopping import StopFlag
from tests.conftest import EVAL_SMALL, FAST


def _cli(tmp_path, run_dir, *extra):
    args = [sys.executable, "-m", "solrl_cli", "train", "--run-dir", str(run_dir), *extra]
    for s in (*FAST, "run.eval_prompts="):
        args += ["--set", s]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)


def _signal_at(proc, sig, marker):
    """Read the process's output until a line starting with `marker`, send `sig`, return all output."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(marker):
            proc.send_signal(sig)
            break
    lines.append(proc.stdout.read())
    proc.wait(timeout=180)
    return "".join(lines)


def _run(sets, stop=None, resume=False, checkpoint=None, watch=None):
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    if watch is not None:
        bus.subscribe(watch)
    try:
        return train(resolve_config("tiny", "sol_rl", sets=sets), bus, resume=resume, stop=stop or StopFlag(),
                     checkpoint=checkpoint), seen
    except SolrlError as exc:
        return exc, seen


@pytest.fixture
def quick(fast_sets):
    return lambda *extra, run_dir="run": fast_sets("run.eval_prompts=", *extra, run_dir=run_dir)


# ---------------------------------------------------------------- signals to a real process


def test_ctrl_c_is_acknowledged_at_once_and_names_the_real_folder(tmp_path):
    run_dir = tmp_path / "r"
    out = _signal_at(_cli(tmp_path, run_dir, "--iterations", "200"), signal.SIGINT, "iter    1/")
    lines = out.splitlines()
    ack = next(i for i, line in enumerate(lines) if line.startswith("stop requested (Ctrl-C)"))
    assert f"{run_dir}/checkpoints" in lines[ack], out
    assert "Ctrl-C again stops at once" in lines[ack] and "no checkpoint has been saved yet" in lines[ack]
    if "finishing iteration 2 (now in " in lines[ack]:  # the signal landed in iteration 2: said before it ends
        assert lines[ack + 1].startswith("iter    2/"), out
        saved = "iter_000002"
    else:  # it landed between iteration 1's line and iteration 2
        assert "saving iteration 1 to" in lines[ack] and lines[ack + 1].startswith("  checkpoint "), out
        saved = "iter_000001"
    assert f"`solrl train --resume {run_dir}` continues from {saved}" in out, out
    assert "<run dir>" not in out and "RUN_DIR" not in out


def test_sighup_in_plain_mode_saves_and_stops_like_sigterm(tmp_path):
    run_dir = tmp_path / "r"
    proc = _cli(tmp_path, run_dir, "--iterations", "200", "--set", "run.stop_on_sigterm=iteration")
    _signal_at(proc, signal.SIGHUP, "iter    1/")
    assert proc.returncode == 130  # not killed by the signal: it saved and stopped
    saved = list_checkpoints(run_dir)
    assert saved and verify(saved[-1]) is None
    records = [ev.decode(json.loads(line)) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    stops = [e for e in records if isinstance(e, ev.StopRequested)]
    assert [e.source for e in stops] == ["SIGHUP"] and stops[0].mode == "iteration"
    assert [e.reason for e in records if isinstance(e, ev.RunFinished)] == ["interrupted"]


def test_sigterm_stops_at_the_next_phase_boundary_and_saves_the_last_finished_iteration(tmp_path):
    run_dir = tmp_path / "r"
    proc = _cli(tmp_path, run_dir, "--iterations", "200")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("iter    1/"):
            time.sleep(0.5)  # into iteration 2, most likely
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(lines) + proc.stdout.read()
    assert proc.wait(timeout=180) == 130, out
    ack = next(line for line in out.splitlines() if line.startswith("stop requested (SIGTERM): "))
    finished = [line for line in out.splitlines() if line.startswith("stopped after iteration")]
    done = int(finished[0].split()[3].rstrip(";"))
    found = re.search(r"now in (\w+) of iteration (\d+)", ack)
    if found:  # an iteration whose update had not begun is abandoned; one past it is finished
        phase, iteration = found.group(1), int(found.group(2))
        assert "stopping at the next phase boundary" in ack
        assert done == (iteration - 1 if phase in ("explore", "selection", "regenerate") else iteration), out
    else:
        assert f"saving iteration {done} to" in ack, out
    assert [p.name for p in list_checkpoints(run_dir)] == [f"iter_{done:06d}"]


def test_a_run_stopped_before_its_first_checkpoint_starts_again_with_resume_or_without(tmp_path):
    run_dir = tmp_path / "r"
    out = _signal_at(_cli(tmp_path, run_dir, "--iterations", "200"), signal.SIGTERM, "  run dir")
    assert ("no checkpoint was saved: `solrl train --resume" in out
            and "intact" not in out.split("stop requested")[-1]), out
    assert not list_checkpoints(run_dir) and (run_dir / "config.toml").exists()
    sets = [a for s in (*FAST, "run.eval_prompts=") for a in ("--set", s)]
    for way in (["--resume", str(run_dir)], ["--run-dir", str(run_dir), *sets]):
        done = subprocess.run([sys.executable, "-m", "solrl_cli", "train", *way, "--iterations", "1"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "held a run with no checkpoint" in done.stdout and "starting it again from iteration 0" in done.stdout
        assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000001"]
        shutil.rmtree(list_checkpoints(run_dir)[0])  # no checkpoint again, for the other way in


# `solrl` whose evaluation batches each take sys.argv[1] seconds more (Engine.decode decodes the
# evaluations' batches, never training's): a real model's evaluation takes minutes, the tiny one's a
# fraction of a second, and the signal must land inside it whatever the machine's load.
_SLOW_EVAL = textwrap.dedent("""
    import sys, time
    from solrl_core.engine.engine import Engine

    real_decode, pause = Engine.decode, float(sys.argv[1])

    def decode(self, latents):
        time.sleep(pause)
        return real_decode(self, latents)

    Engine.decode = decode
    from solrl_cli.app import main

    sys.argv = ["solrl", *sys.argv[2:]]
    main()
""")
EVAL_BATCH_S = 1.0  # per batch of the slowed evaluation: 4 batches, so it would end 4 s or more after it began
EVAL_SETS = ("run.eval_seeds=16", "sampler.eval_steps=2")  # EVAL_SMALL's 4 prompts x 16 seeds: 4 batches of 16


def _slow_eval(tmp_path, *args):
    script = tmp_path / "slow_eval.py"
    script.write_text(_SLOW_EVAL)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "COLUMNS": "200", "SOLRL_DEBUG": ""}
    return subprocess.Popen([sys.executable, str(script), str(EVAL_BATCH_S), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)


def _events(run_dir):
    return [ev.decode(json.loads(line)) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sigterm_during_the_base_evaluation_drops_it_and_a_resume_does_it_first(tmp_path):
    run_dir = tmp_path / "r"
    sets = [a for s in (*FAST, *EVAL_SETS) for a in ("--set", s)]
    proc = _slow_eval(tmp_path, "train", "--run-dir", str(run_dir), "--iterations", "1", *sets)
    out = _signal_at(proc, signal.SIGTERM, "  evaluating the base weights")
    assert proc.returncode == 130, out  # a stop: not killed by the signal, not a failure
    assert (((((((("stop requested (SIGTERM): dropping the base evaluation (a resume does it first): nothing to save "
                   "yet" in out)))))))), out
    assert "the base evaluation is dropped (a stop was requested with " in out, out
    assert "stopped after iteration 0; no checkpoint was saved" in out and "Traceback" not in out, out
    # the order, not the clock: the evaluation ended without finishing, and before its last batch
    records = _events(run_dir)
    kinds = [type(e).__name__ for e in records]
    tail = kinds[kinds.index("EvalStarted") + 1:]
    assert tail[-2:] == ["RunWarning", "RunFinished"] and "StopRequested" in tail, kinds
    assert set(tail[:-2]) <= {"EvalProgress", "StopRequested"}, kinds  # no EvalFinished: dropped between two batches
    assert not [e for e in records if isinstance(e, ev.EvalFinished)], kinds
    assert max((e.done for e in records if isinstance(e, ev.EvalProgress)), default=0) < 64, kinds
    assert [e.reason for e in records if isinstance(e, ev.RunFinished)] == ["interrupted"]
    assert not list_checkpoints(run_dir) and not (run_dir / "eval_base.json").exists()

    done = subprocess.run([sys.executable, "-m", "solrl_cli", "train", "--resume", str(run_dir)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    again = _events(run_dir)[len(records):]
    assert [(type(e).__name__, getattr(e, "weights", "")) for e in again
            if isinstance(e, (ev.EvalFinished, ev.IterationFinished, ev.CheckpointSaved))] == [
        ("EvalFinished", "base"), ("IterationFinished", ""), ("EvalFinished", "ema"), ("CheckpointSaved", "")]
    assert [e.reason for e in again if isinstance(e, ev.RunFinished)] == ["completed"]


@pytest.mark.slow
def test_sigterm_during_solrl_eval_stops_it_with_one_line(tmp_path):
    out_dir = tmp_path / "ev"
    proc = _slow_eval(tmp_path, "eval", "--model", "tiny", "--prompts", str(EVAL_SMALL), "--seeds", "16", "--steps",
                      "2",
                      "--rewards", "", "--out", str(out_dir))
    out = _signal_at(proc, signal.SIGTERM, "  evaluating the base weights")
    assert proc.returncode == 130, out  # before, SIGTERM killed it (-15) with nothing said
    assert "stopped (SIGTERM): the evaluation of the base weights was dropped (a stop was requested with " in out, out
    assert "no image was scored, and no summary.json was written" in out and "Traceback" not in out, out
    assert "eval (base weights" not in out and not (out_dir / "summary.json").exists(), out


# ---------------------------------------------------------------- in process


class _StopIn(StopFlag):
    """Asks for a phase-boundary stop as `phase` of `iteration` begins: where a signal would land."""

    def __init__(self, iteration, phase):
        super().__init__()
        self.at, self.seen = (iteration, phase), 0

    def entering(self, phase):
        if phase == "explore":
            self.seen += 1
        if (self.seen, phase) == self.at:
            self.request("SIGTERM", at_phase=True)
        super().entering(phase)


def test_a_phase_stop_abandons_the_iteration_and_a_resume_equals_an_uninterrupted_run(quick):
    straight, _ = _run(quick("run.iterations=3", run_dir="a"))
    sets = quick("run.iterations=3", run_dir="b")
    stopped, seen = _run(sets, stop=_StopIn(2, "regenerate"))
    assert stopped.state.iteration == 1
    assert [p.name for p in list_checkpoints(stopped.run.run_dir)] == ["iter_000001"]
    acks = [e for e in seen if isinstance(e, ev.StopRequested)]
    # asked as regenerate was about to begin
    assert [(e.mode, e.iteration, e.phase) for e in acks] == [("phase", 2, "selection")]
    end = [e for e in seen if isinstance(e, ev.RunFinished)][0]
    assert end.reason == "interrupted" and end.checkpoint.endswith("iter_000001")
    resumed, _ = _run(sets, resume=True)
    assert resumed.state.history == straight.state.history
    for which in ("default", "old", "ema"):
        x, y = straight.run.engine.policy.state(which), resumed.run.engine.policy.state(which)
        assert all(torch.equal(x[k], y[k]) for k in x), which


def test_a_phase_stop_once_the_update_began_finishes_the_iteration(quick):
    stopped, _ = _run(quick("run.iterations=3"), stop=_StopIn(2, "sync"))
    assert stopped.state.iteration == 2
    assert [p.name for p in list_checkpoints(stopped.run.run_dir)] == ["iter_000002"]


def test_a_resume_from_an_older_checkpoint_sets_newer_ones_aside_only_once_committed(quick, monkeypatch):
    sets = quick("run.iterations=3", "run.checkpoint_every=1", "run.keep_checkpoints=3")
    first, _ = _run(sets)
    run_dir = first.run.run_dir
    first.run.lock.release()
    import solrl_core.engine.engine as engine

    real = engine.load_model

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the model loads

    monkeypatch.setattr(engine, "load_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _run(sets, resume=True, checkpoint="iter_000001")
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000001", "iter_000002", "iter_000003"]
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("superseded-")]
    monkeypatch.setattr(engine, "load_model", real)
    resumed, _ = _run(sets, resume=True, checkpoint="iter_000001")
    assert resumed.state.iteration == 3
    aside = sorted(p.name.split("-")[1] for p in (run_dir / "checkpoints").iterdir()
                   if p.name.startswith("superseded-"))
    assert aside == ["iter_000002", "iter_000003"]


def test_every_view_says_the_real_folder_and_whether_a_checkpoint_exists(tmp_path):
    from rich.console import Console

    none_yet = ev.StopRequested(source="Ctrl-C", mode="iteration", iteration=1, phase="explore", run_dir="/r/x",
                                checkpoint=None)
    assert "no checkpoint has been saved yet" in stop_message(none_yet)
    failed = ev.RunFinished(reason="failed", iteration=0, seconds=1.0, first_reward=None, last3_reward=None,
                            run_dir="/r/x")
    assert "intact" not in finished_message(failed) and "starts it again from iteration 0" in finished_message(failed)
    console = Console(file=io.StringIO(), width=300)
    view = TerminalDisplay(console)
    view(none_yet)
    view(ev.RunFinished(reason="interrupted", iteration=4, seconds=1.0, first_reward=None, last3_reward=None,
                        run_dir="/r/x", checkpoint="/r/x/checkpoints/iter_000004"))
    text = console.file.getvalue()
    assert "/r/x/checkpoints" in text and "`solrl train --resume /r/x` continues from iter_000004" in text


class _StopInEval:
    """Asks for a phase-boundary stop (a SIGTERM's) once the evaluation of `weights` reported its first
    batch: where a signal would land in an evaluation of many batches."""

    def __init__(self, flag, weights):
        self.flag, self.weights = flag, weights

    def __call__(self, e):
        if isinstance(e, ev.EvalProgress) and e.weights == self.weights and not self.flag.requested:
            self.flag.request("SIGTERM", at_phase=True)


def test_a_stop_during_the_last_evaluation_saves_the_iteration_and_a_resume_evaluates_as_an_uninterrupted_run(
        fast_sets):
    # 64 evaluation images in 4 batches, run 2 at a time on the CPU's lanes: the stop lands after the first 2
    straight, straight_seen = _run(fast_sets("run.eval_seeds=16", "sampler.eval_steps=2", "run.iterations=1",
                                             run_dir="a"))
    sets = fast_sets("run.eval_seeds=16", "sampler.eval_steps=2", "run.iterations=1", run_dir="b")
    flag = StopFlag()
    stopped, seen = _run(sets, stop=flag, watch=_StopInEval(flag, "ema"))
    assert stopped.state.iteration == 1 and not stopped.state.finished(1)  # `solrl train` exits 130: not done
    saved = list_checkpoints(stopped.run.run_dir)
    assert [p.name for p in saved] == ["iter_000001"]
    assert json.loads((saved[0] / "trainer_state.json").read_text())["evaluation_pending"] is True
    assert [(e.phase, e.iteration) for e in seen if isinstance(e, ev.StopRequested)] == [("evaluation", 1)]
    assert [e.weights for e in seen if isinstance(e, ev.EvalFinished)] == ["base"]
    assert any("the evaluation of iteration 1 is dropped" in e.message for e in seen if isinstance(e, ev.RunWarning))
    assert [e.reason for e in seen if isinstance(e, ev.RunFinished)] == ["interrupted"]

    resumed, again = _run(sets, resume=True)  # the evaluation first, nothing trained again
    assert not [e for e in again if isinstance(e, ev.IterationFinished)]
    evals = [e for e in again if isinstance(e, ev.EvalFinished)]
    expected = [e for e in straight_seen if isinstance(e, ev.EvalFinished) and e.weights == "ema"]
    assert [(e.weights, e.iteration, e.mean, e.components) for e in evals] == [
        (e.weights, e.iteration, e.mean, e.components) for e in expected]
    assert [e.reason for e in again if isinstance(e, ev.RunFinished)] == ["completed"]
    assert resumed.state.history == straight.state.history
    for which in ("default", "old", "ema"):
        x, y = straight.run.engine.policy.state(which), resumed.run.engine.policy.state(which)
        assert all(torch.equal(x[k], y[k]) for k in x), which
    assert "evaluation_pending" not in json.loads((saved[0] / "trainer_state.json").read_text())  # saved again, done
    refused, _ = _run(sets, resume=True)
    assert isinstance(refused, SolrlError) and "already reached its 1 iteration" in refused.message
