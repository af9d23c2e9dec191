"""TensorBoard and W&B trackers on a 2-iteration tiny run (no network: W&B offline), read back with
each tool's own reader; a resumed run continues the same series."""

import dataclasses
import json

import pytest

from solrl_core import events as ev
from solrl_core.errors import SolrlError
from solrl_core.tracking import metrics, require
from tests.helpers import train_recording as _train


def _scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def test_tensorboard_holds_both_iterations_and_a_resume_continues_them(fast_sets):
    sets = fast_sets("run.iterations=2", "run.log=tensorboard", "run.image_every=2", "run.checkpoint_every=1",
                     "run.eval_prompts=")
    session, seen = _train(sets, stop_after=1)  # stopped after iteration 1, checkpoint saved
    assert session.state.iteration == 1
    session, seen2 = _train([*sets], resume=True)
    acc = _scalars(session.run.run_dir)
    tags = acc.Tags()["scalars"]
    for tag in ("reward/final/mean", "reward/draft/mean", "reward/final/component/tinyworld_geneval", "time/explore",
                "time/total", "loss/loss", "train/grad_norm"):
        assert tag in tags
    its = {e.iteration: e for e in seen + seen2 if isinstance(e, ev.IterationFinished)}
    final = acc.Scalars("reward/final/mean")
    assert [s.step for s in final] == [1, 2]  # one series over the stop and the resume
    assert [s.value for s in final] == pytest.approx([its[1].final.mean, its[2].final.mean])
    assert [s.value
            for s in acc.Scalars("time/regenerate")] == pytest.approx([its[1].seconds["regenerate"],
                                                                       its[2].seconds["regenerate"]])
    grid = [e for e in seen2 if isinstance(e, ev.SampleGrid)]
    assert len(grid) == 1 and grid[0].iteration == 2 and grid[0].rewards == sorted(grid[0].rewards, reverse=True)
    assert [i.step for i in acc.Images("samples")] == [2]
    env = next(e for e in seen if isinstance(e, ev.RunStarted)).environment  # what the run started on
    assert env["device"] == "cpu" and env["gpus"] == [] and env["explore"] == {
        "requested": "auto", "resolved": "nvfp4-emulated", "full_precision": "fp32",
                "implemented": ["nvfp4", "fp8", "nvfp4-emulated", "fp8-e5m2-tensor", "fp8-e5m2-delayed", "bf16",
                                "fp32"],
        "why": "auto on a CPU: the exact NVFP4 emulation (no real low-precision kernel runs here)"}
    assert "rollout copy on" in env["machine"]
    board = session.run.run_dir / "tensorboard"
    started = [e for e in seen + seen2 if isinstance(e, ev.RunStarted)]
    # said where
    assert [e.tracking for e in started] == [[f"TensorBoard: {board}  (view: tensorboard --logdir {board})"]] * 2
    assert env["libraries"]["torch"] and "installed" in env["transformer_engine"] and "installed" in env["torchao"]


def _wandb_records(path):
    """The records of a W&B transaction log (run-ID.wandb), parsed with W&B's own protobuf schema.
    The file is a 7-byte W&B header, then LevelDB-log framing: 32 KiB blocks of chunks, each with a
    7-byte header (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, parts = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # padding to the end of the block
            pos += left
            continue
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def _wandb_run(folder):
    """(run id, config, history rows, final summary) of one offline run folder."""
    run_id, config, history, summary = None, {}, [], {}
    for record in _wandb_records(next(folder.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "summary":
            summary.update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.summary.update})
    return run_id, config, history, summary


def test_wandb_offline_summary_and_resume_keep_one_run(fast_sets, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "solrl-test")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    sets = fast_sets("run.iterations=2", "run.log=wandb", "run.image_every=0", "run.checkpoint_every=1",
                     "run.eval_prompts=")
    session, seen = _train(sets, stop_after=1)
    run_dir = session.run.run_dir
    stored = json.loads((run_dir / "wandb_run.json").read_text())
    assert stored["project"] == "solrl-test"
    session, seen2 = _train(sets, resume=True)
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 2
    (first_id, config, first, _), (second_id, _, second, summary) = (_wandb_run(f) for f in folders)
    assert first_id == second_id == stored["id"]  # the resume logs to the same W&B run
    assert [row["_step"] for row in first + second] == [1, 2]  # and continues its series
    last = next(e for e in reversed(seen2) if isinstance(e, ev.IterationFinished))
    assert summary["_step"] == 2 and summary["reward/final/mean"] == pytest.approx(last.final.mean)
    assert summary["time/train"] == pytest.approx(last.seconds["train"])
    assert config["reward"]["weights"] == {"tinyworld_geneval": 1.0}  # the resolved config
    assert config["run"]["log"] == ["wandb"]
    for started, folder in zip((e for e in seen + seen2 if isinstance(e, ev.RunStarted)), folders):
        assert started.tracking == [f"W&B offline run: {folder.resolve()}  (upload: wandb sync {folder.resolve()})"]


def test_a_tracker_that_is_not_installed_is_named(monkeypatch, fast_sets, tmp_path):
    from solrl_core import tracking

    monkeypatch.setattr(tracking, "REQUIRES", {"tensorboard": "tensorboard", "wandb": "no_such_module_here"})
    with pytest.raises(SolrlError, match="run.log names wandb") as exc:
        require(("tensorboard", "wandb"))
    assert "[tracking]" in exc.value.fix
    with pytest.raises(SolrlError, match="wandb"):
        _train(fast_sets("run.log=wandb"))
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def test_cli_names_a_missing_tracker_in_one_line(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from solrl_cli.app import app
    from solrl_core import tracking

    monkeypatch.setattr(tracking, "REQUIRES", {"tensorboard": "tensorboard", "wandb": "no_such_module_here"})
    result = CliRunner().invoke(app, ["train", "--log", "tensorboard,wandb", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code != 0 and "run.log names wandb, which is not installed" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "r").exists()
    result = CliRunner().invoke(app, ["train", "--log", "tensorbord", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code != 0 and "unknown run.log 'tensorbord'" in result.output and "tensorboard" in result.output


def test_metric_names_are_stable_and_take_new_per_phase_fields():
    it = ev.IterationFinished(iteration=3, iterations=9, seconds={"explore": 1.0, "total": 2.0}, draft=None,
                              final=ev.RewardStats(mean=0.5, std=0.1, best=0.9, worst=0.1,
                                                   components={"pickscore": 0.5}),
                              loss={"loss": 1.0, "policy": 0.9, "kl": 0.1}, nonfinite_losses=0, grad_norm=0.3,
                              old_decay=0.0)
    record = dataclasses.replace(it, peak_memory={"explore": 7.5, "train": 30.25})  # a per-phase dict field
    step, values = metrics.scalars(record)
    assert step == 3
    assert values == {"time/explore": 1.0, "time/total": 2.0, "reward/final/mean": 0.5, "reward/final/std": 0.1,
                      "reward/final/best": 0.9, "reward/final/worst": 0.1, "reward/final/component/pickscore": 0.5,
                      "loss/loss": 1.0, "loss/policy": 0.9, "loss/kl": 0.1, "loss/nonfinite": 0.0,
                      "train/grad_norm": 0.3,
                      "train/old_decay": 0.0, "memory/explore": 7.5, "memory/train": 30.25}
    check = ev.RankCheckResult(iteration=4, prompt="p", seeds=8, rho=None, tau=0.5, draft_mean=0.1, full_mean=0.2,
                               seconds=1.0)
    assert metrics.scalars(check) == (4, {"rank_check/tau": 0.5, "rank_check/draft_mean": 0.1,
                                                    "rank_check/full_mean": 0.2, "rank_check/seconds": 1.0})
    evaluation = ev.EvalFinished(iteration=0, weights="base", prompts="x", samples=4, mean=0.4, components={"a": 0.4},
                                 extras={"a.strict": 0.2}, seconds=1.5)
    assert metrics.scalars(evaluation) == (0, {"eval/mean": 0.4, "eval/component/a": 0.4, "eval/a.strict": 0.2,
                                                         "eval/seconds": 1.5})


def test_a_wandb_that_cannot_start_is_one_line_with_the_fix(monkeypatch, tmp_path):
    wandb = pytest.importorskip("wandb")
    from solrl_core.tracking.wandb_log import WandbLog

    def refuse(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])\nmore")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(SolrlError, match=r"W&B could not start a run: api_key not configured \(no-tty\)") as exc:
        WandbLog(tmp_path, {}, resumed=False)
    assert "WANDB_MODE=offline" in exc.value.fix and "\n" not in exc.value.message


@pytest.mark.slow
def test_a_failed_wandb_start_leaves_no_half_made_run(monkeypatch, fast_sets, tmp_path):
    wandb = pytest.importorskip("wandb")

    def refuse(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    with pytest.raises(SolrlError, match="W&B could not start a run"):
        _train(fast_sets("run.log=tensorboard,wandb", "run.eval_prompts="))
    assert not (tmp_path / "run").exists()  # no config.toml, no empty events.jsonl, no tensorboard/ or wandb/ folder


def test_a_failed_start_keeps_what_it_did_not_make(tmp_path):
    from solrl_core.tracking import undo_start

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    before = set(mine.iterdir())
    for name in ("config.toml", "events.jsonl", "solrl.lock"):
        (mine / name).write_text("")
    (mine / "wandb").mkdir()
    undo_start(mine, before | {mine / "config.toml", mine / "events.jsonl", mine / "solrl.lock"}, fresh=True)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # a folder that held other files stays, with them

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "config.toml").write_text("")
    before = set(resumed.iterdir())
    (resumed / "wandb").mkdir()
    undo_start(resumed, before, fresh=False)
    assert sorted(p.name for p in resumed.iterdir()) == ["config.toml"]  # a resumed run keeps its own files


def test_the_terminal_says_where_the_trackers_write():
    import io

    from rich.console import Console

    from solrl_view.display import TerminalDisplay

    console = Console(file=io.StringIO(), width=200)
    display = TerminalDisplay(console)
    line = "W&B offline run: /r/wandb/offline-run-1  (upload: wandb sync /r/wandb/offline-run-1)"
    display(ev.RunStarted(run_dir="/r", preset="p", device="cpu", dtype="fp32", explore_precision="fp32", plan="plan",
                          start_iteration=0, iterations=1, resumed=False, config={}, tracking=[line]))
    display.progress.stop()
    assert f"  {line}" in console.file.getvalue()


@pytest.mark.parametrize("body", ['{"id": "abc123"}', '[' * 100_000 + ']' * 100_000, '{"id": 5}', '{"id": "../../x"}',
                                  "{"])
def test_a_saved_wandb_run_id_is_read_as_data(tmp_path, body):
    """RUN/wandb_run.json comes from a run folder: a plain id is used, anything else is one line."""
    from solrl_core.errors import SolrlError
    from solrl_core.tracking.wandb_log import _saved_id

    (path := tmp_path / "wandb_run.json").write_text(body)
    if body.startswith('{"id": "abc'):
        assert _saved_id(path) == "abc123"
        return
    with pytest.raises(SolrlError, match="wandb_run.json"):
        _saved_id(path)
