"""Eval rewards (run.eval_rewards) and the reward-hacking warning: a second, independent score on
the evaluation's images, shown base -> now with its paired standard error and its hacking floor
wherever a run is shown; a run trained to hack (the shipped `brightness` reward) is caught within
the run, run.on_hacking=stop stops it with a checkpoint that resumes exactly (the deprecated
run.stop_on_hacking too), and rollback returns it to its base. CPU, no network."""

from __future__ import annotations

import io
import json

import pytest
import torch
from safetensors.torch import load_file
from rich.console import Console
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_view.display import TerminalDisplay
from solrl_cli.tui.panels import eval_view
from solrl_cli.tui.state import RunState
from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.data.tinyworld import example
from solrl_core.loop.evaluation import BASE_FILE
from solrl_core.loop.trainer import train
from solrl_core.rewards.palette import PaletteFidelity
from solrl_core.tracking.metrics import scalars
from tests.conftest import FAST
from tests.helpers import stop_flag_after

CAPTIONS = "a red circle\ntwo blue squares\na green triangle left of a yellow circle\na red circle and a blue square\n"
# lr 3e-3 brightens the tiny world's images within 2 iterations (its fidelity from about 0.9 to 0.5)
HACK = ("optimizer.lr=3e-3", "run.iterations=4", "run.eval_every=2", "run.eval_seeds=2", "sampler.eval_steps=3")


def _scenes(n: int = 6) -> torch.Tensor:
    return torch.stack([torch.from_numpy(example(i)[1]).permute(2, 0, 1).float() / 255 for i in range(n)])


def test_fidelity_is_one_on_rendered_scenes_and_falls_as_they_degrade():
    fidelity, clean = PaletteFidelity(), _scenes()
    assert fidelity(clean, []).tolist() == [1.0] * 6  # flat paint in the palette's colours
    noisy = (clean + 0.05 * torch.randn(clean.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    washed = (clean + 0.15).clamp(0, 1)
    blurred = torch.nn.functional.avg_pool2d(clean, 3, stride=1, padding=1, count_include_pad=False)
    for degraded in (noisy, washed, blurred):
        assert (fidelity(degraded, []) < 0.95).all()
    assert (fidelity(washed, []) < fidelity(noisy, [])).all()  # washing out the background is the worst of these


def _train(sets, resume=False, stop_after=None, reward=None):
    """A tiny run through the plain display: its printed text and events."""
    out, seen = io.StringIO(), []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    bus.subscribe(TerminalDisplay(Console(file=out, width=400, highlight=False, markup=False)))
    flag = stop_flag_after(bus, stop_after)
    train(resolve_config("tiny", "sol_rl", reward=reward, sets=sets), bus, resume=resume, stop=flag)
    return out.getvalue(), seen


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval_rewards")
    (tmp / "ev.txt").write_text(CAPTIONS)
    return tmp


def _sets(folder, name, *extra):
    return [*FAST, f"run.run_dir={folder / name}", f"run.eval_prompts={folder / 'ev.txt'}", *extra]


def test_a_tiny_run_shows_its_second_score_base_to_now_with_standard_errors(folder):
    text, seen = _train(_sets(folder, "plain", "sampler.eval_steps=3", "run.eval_every=2", "run.iterations=2"))
    evals = [e for e in seen if isinstance(e, ev.EvalFinished)]
    assert [set(e.eval_rewards) for e in evals] == [{"tinyworld_fidelity"}] * 2  # the tiny preset's default
    last = evals[-1]
    assert set(last.eval_se) == {"tinyworld_fidelity"} and last.eval_se["tinyworld_fidelity"] > 0
    base, now = evals[0].eval_rewards["tinyworld_fidelity"], last.eval_rewards["tinyworld_fidelity"]
    assert last.eval_changes["tinyworld_fidelity"] == pytest.approx(now - base)
    summary = text[text.index("done: "):]
    assert "s.e.)" in next(line for line in summary.splitlines() if line.startswith("  eval on "))
    line = next(line for line in summary.splitlines() if line.startswith("  eval rewards (scored, not trained on):"))
    se = last.eval_se["tinyworld_fidelity"]
    floor = last.eval_floors["tinyworld_fidelity"]
    assert floor == 0.1  # the floor the registry declares for it
    # the gain bought per unit of it lost since the last evaluation (the base here: loop/frontier.py)
    assert last.trade_since == 0
    traded = (f"{last.trade['tinyworld_fidelity']:.3g} gain per unit lost" if "tinyworld_fidelity" in last.trade
              else "none lost beyond noise")
    assert (f"tinyworld_fidelity base {base:.4g} -> ema {now:.4g} ({now - base:+.4f} +- {se:.4f} s.e.; floor "
            f"{floor:.4g}; since the base: {traded})") in line
    if "tinyworld_fidelity" in last.trade:
        assert last.trade["tinyworld_fidelity"] == pytest.approx((last.mean - evals[0].mean) / (base - now))
    assert json.loads((folder / "plain" / BASE_FILE).read_text())["eval_rewards"]["tinyworld_fidelity"]
    state = RunState()  # the TUI's evaluations panel
    for e in seen:
        state.apply(e)
    console = Console(file=io.StringIO(), width=120, record=True)
    console.print(eval_view(state))
    panel = console.export_text().splitlines()
    shown = next(row for row in panel if "tinyworld_fidelity (eval)" in row)
    assert shown.split()[-1] == "-0.1"  # against its floor
    assert "trade: gain per unit of tinyworld_fidelity lost since the last" in " ".join(panel)
    row = next(r for r in panel if r.split()[:2] == ["2", "ema"])  # iter, weights, reward, change, s.e., trade, s
    assert row.split()[5] == (f"{last.trade['tinyworld_fidelity']:.3g}" if "tinyworld_fidelity" in last.trade else "-")
    step, values = scalars(last)  # TensorBoard and W&B
    assert step == 2 and values["eval_reward/tinyworld_fidelity/change_se"] == se
    assert values["eval_reward/tinyworld_fidelity/floor"] == -floor


@pytest.fixture(scope="module")
def hacked(folder):
    """The shipped made-to-hack reward, trained on with run.on_hacking=warn: its printed text and events."""
    return _train(_sets(folder, "hack", *HACK), reward="brightness")


def test_a_run_trained_to_hack_is_warned_within_the_run(folder, hacked):
    text, seen = hacked
    warned = [e for e in seen if isinstance(e, ev.RewardHacking)]
    assert (warned and warned[0].iteration == 2 and warned[0].reward == "tinyworld_fidelity" and warned[0].action
            == "warn")
    w = warned[0]
    assert w.trained_change > 0 and w.change < -2 * w.se and w.change < -w.floor and w.floor == 0.1
    assert (f"reward hacking? iteration 2: the trained reward brightness rose {w.trained_change:+.4f}" in text
            and "more than 2 s.e. and its floor 0.1)" in text)
    logged = [json.loads(line) for line in (folder / "hack" / "events.jsonl").read_text().splitlines()]
    assert any(r["event"] == "reward_hacking" for r in logged)
    assert next(e for e in seen if isinstance(e, ev.RunFinished)).reason == "completed"  # a warning, not a stop


def test_stop_on_hacking_stops_with_a_checkpoint_that_resumes_exactly(folder, hacked):
    sets = _sets(folder, "stop", *HACK)
    _, seen = _train([*sets, "run.stop_on_hacking=true"], reward="brightness")  # the deprecated boolean still stops
    assert any("run.stop_on_hacking is deprecated" in e.message for e in seen if isinstance(e, ev.RunWarning))
    end = next(e for e in seen if isinstance(e, ev.RunFinished))
    assert end.reason == "interrupted" and end.iteration == 2 and end.checkpoint.endswith("iter_000002")
    assert [e.action for e in seen if isinstance(e, ev.RewardHacking)] == ["stop"]
    _, seen = _train([*sets, "run.stop_on_hacking=false"], resume=True, reward="brightness")
    started = next(e for e in seen if isinstance(e, ev.RunStarted))
    assert started.resumed and started.start_iteration == 2
    assert next(e for e in seen if isinstance(e, ev.RunFinished)).reason == "completed"
    assert not any(isinstance(e, ev.RunWarning) for e in seen)  # the base evaluation, eval rewards included, read back
    for name in ("pytorch_lora_weights.safetensors", "ema/pytorch_lora_weights.safetensors"):  # as if never stopped
        a, b = (load_file(str(folder / run / "checkpoints" / "iter_000004" / name)) for run in ("hack", "stop"))
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_rollback_with_nothing_evaluated_before_the_fall_returns_to_the_base_and_stops(folder):
    _, seen = _train(_sets(folder, "back", *HACK, "run.on_hacking=rollback"), reward="brightness")
    kinds = [type(e).__name__ for e in seen if isinstance(e, (ev.RewardHacking, ev.RolledBack, ev.RunFinished))]
    assert kinds == ["RewardHacking", "RolledBack", "RunFinished"]
    back, end = (next(e for e in seen if isinstance(e, t)) for t in (ev.RolledBack, ev.RunFinished))
    assert (back.iteration, back.to, back.then) == (2, 0, "stop") and back.checkpoint.endswith("iter_000000")
    assert end.iteration == 0 and end.checkpoint.endswith("iter_000000")  # the base weights, evaluated before the fall


def test_a_base_kept_without_eval_rewards_resumes_with_a_warning(folder):
    sets = _sets(folder, "old", "sampler.eval_steps=3", "run.eval_every=2", "run.iterations=2")
    _train(sets, stop_after=1)
    kept = folder / "old" / BASE_FILE
    record = json.loads(kept.read_text())
    del record["eval_rewards"]  # as an earlier solrl wrote it
    kept.write_text(json.dumps(record))
    text, seen = _train(sets, resume=True)
    warnings = [e.message for e in seen if isinstance(e, ev.RunWarning)]
    assert any("holds no base scores of the eval reward tinyworld_fidelity" in m for m in warnings), warnings
    assert next(e for e in seen if isinstance(e, ev.RunFinished)).reason == "completed"
    # the trained reward still compares
    assert "s.e.)" in next(line for line in text.splitlines() if line.startswith("  eval on "))
    assert "  eval rewards (scored, not trained on): tinyworld_fidelity " in text  # its mean, with no base to compare


def test_solrl_eval_scores_any_rewards_after_the_fact(folder, monkeypatch):
    monkeypatch.chdir(folder)
    runner = CliRunner()
    args = [a for s in FAST for a in ("--set", s)]
    assert runner.invoke(app, ["train", *args, "--iterations", "1", "--run-dir", "e"]).exit_code == 0
    result = runner.invoke(app, ["eval", "e", "--prompts", "ev.txt", "--seeds", "2", "--steps", "2", "--out", "ev",
                                 "--rewards", "tinyworld_fidelity,jpeg_compressibility"])
    assert result.exit_code == 0, result.output
    assert "tinyworld_fidelity (eval)" in result.output and "jpeg_compressibility (eval)" in result.output
    summary = json.loads((folder / "ev" / "summary.json").read_text())
    for name in ("tinyworld_fidelity", "jpeg_compressibility"):
        ema, base = summary["ema"]["eval_rewards"][name], summary["base"]["eval_rewards"][name]
        assert ema["delta"] == pytest.approx(ema["mean"] - base["mean"]) and ema["delta_se"] > 0
    rows = [json.loads(line) for line in (folder / "ev" / "samples.jsonl").read_text().splitlines()]
    assert "eval.jpeg_compressibility" in rows[0]
    bad = runner.invoke(app, ["eval", "e", "--rewards", "tinyworld_fidelty"])
    assert bad.exit_code == 2 and "tinyworld_fidelity" in bad.output  # a typo named, with the close match


def test_an_eval_reward_that_cannot_load_is_named_with_how_to_go_on_without_it(tmp_path):
    from solrl_core.errors import SolrlError
    from solrl_core.loop.eval_rewards import held_out_rewards

    (tmp_path / "broken.py").write_text("raise RuntimeError('no model here')\n")
    cfg = resolve_config("tiny", "sol_rl")
    broken = f"{tmp_path / 'broken.py'}:score"
    with pytest.raises(SolrlError) as err:
        held_out_rewards(cfg, ("tinyworld_fidelity", broken), torch.device("cpu"))
    assert err.value.message.startswith("eval reward (run.eval_rewards): ") and broken in err.value.message
    assert err.value.fix.endswith("; or evaluate without it: --set run.eval_rewards=tinyworld_fidelity")
    kept = held_out_rewards(cfg, ("tinyworld_geneval", "tinyworld_fidelity"), torch.device("cpu"))
    assert kept.names == ("tinyworld_geneval",
                          "tinyworld_fidelity") and list(kept.rewards.rewards) == ["tinyworld_fidelity"]
