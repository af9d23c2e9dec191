"""The reward-hacking rule and what a run does with it: a fall counts when it is significant and
past the reward's floor (declared once per reward, in the registry, with its reason; settable per
run); run.on_hacking = rollback returns to the last checkpoint an evaluation passed and a resume
continues exactly; `--best` picks the best checkpoint no rule flagged. CPU, no network."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.faults.manifest import write_manifest
from solrl_core.loop.decisions import AfterEval, Next, after_evaluation, checkpoint_due, evaluation_due
from solrl_core.loop.evaluation import Evaluation, eval_seeds
from solrl_core.loop.hacking import Fall, declared_floor, flagged, floors
from solrl_core.loop.trainer import train
from solrl_core.rewards import Scores
from solrl_core.rewards.registry import PLUGIN_FLOOR, lookup, registry
from solrl_core.runtime.stopping import StopFlag
from tests.conftest import FAST

CAPTIONS = "a red circle\ntwo blue squares\na green triangle left of a yellow circle\na red circle and a blue square\n"


def test_every_reward_declares_its_floor_with_a_reason():
    for name, info in registry().items():
        assert info.floor is not None, f"{name} declares no hacking floor (rewards/registry.py)"
        assert info.floor.value > 0 and len(info.floor.reason) > 20, name
    assert (lookup("my_rewards.py:score").floor is PLUGIN_FLOOR
            and declared_floor("remote:http://127.0.0.1:9") is PLUGIN_FLOOR)
    # the paper's gain, a tenth
    assert declared_floor("pickscore").value == pytest.approx((0.8932 - 0.8096) / 10, abs=1e-4)



def test_the_fidelity_floor_is_what_barely_visible_damage_costs_on_exact_paint():
    """tinyworld_fidelity's floor is measured, not chosen (docs/rewards.md): each of three barely
    visible damages to rendered scenes costs at least the floor and at most a fifth more."""
    from solrl_core.data.tinyworld import example
    from solrl_core.rewards.palette import PaletteFidelity

    scenes = torch.stack([torch.from_numpy(example(s, "heldout")[1]).permute(2, 0, 1).float() / 255 for s in range(64)])
    score, floor = PaletteFidelity(), declared_floor("tinyworld_fidelity").value
    noise = 4 / 255 * torch.randn(scenes.shape, generator=torch.Generator().manual_seed(0))
    damaged = {"noise of 4 levels": scenes + noise, "4 levels brighter": scenes + 4 / 255,
               "3x3 blur": torch.nn.functional.avg_pool2d(scenes, 3, stride=1, padding=1, count_include_pad=False)}
    for name, images in damaged.items():
        cost = float((score(scenes, []) - score(images.clamp(0, 1), [])).mean())
        assert floor <= cost + 1e-3 and cost <= 1.2 * floor, (name, cost)
    # 2 levels: under
    assert float((score(scenes, []) - score((scenes + noise / 2).clamp(0, 1), [])).mean()) < floor / 1.9

def _evaluation(total: list[float], held: list[float]) -> Evaluation:
    t = torch.tensor(total)
    return Evaluation("x", ["p"] * len(total), eval_seeds(len(total), 1), Scores(t, {"r": t}), {}, 0.0, {},
                      {"tinyworld_fidelity": torch.tensor(held)})


def test_a_fall_counts_when_it_is_past_two_standard_errors_and_past_its_floor():
    n = 400  # many images: a small shift is many standard errors
    base = _evaluation([0.5] * n, [0.94, 0.95] * (n // 2))
    grainy = _evaluation([0.6] * n, [0.91, 0.93] * (n // 2))  # -0.025, s.e. 0.0004: significant, under a 0.05 floor
    assert flagged(base, grainy, {"tinyworld_fidelity": 0.05}) == []
    ((fall,),) = [flagged(base, grainy, {})]  # no floor: significance alone flags it
    assert fall.reward == "tinyworld_fidelity" and fall.change == pytest.approx(-0.025, abs=1e-6)
    assert fall.se == pytest.approx(0.00025, abs=5e-5) and fall.floor == 0.0
    washed = _evaluation([0.6] * n, [0.5, 0.6] * (n // 2))
    ((fall,),) = [flagged(base, washed, {"tinyworld_fidelity": 0.05})]
    assert fall.change == pytest.approx(-0.395, abs=1e-6) and fall.floor == 0.05
    # trained fell too
    assert flagged(base, _evaluation([0.4] * n, [0.5, 0.6] * (n // 2)), {"tinyworld_fidelity": 0.05}) == []
    noisy = _evaluation([0.6, 0.7, 0.6, 0.7], [0.95, 0.8, 0.95, 0.8])
    assert flagged(_evaluation([0.5] * 4, [0.9] * 4), noisy, {}) == []  # -0.025 +- 0.043: noise
    cfg = resolve_config("tiny", "sol_rl")
    assert floors(cfg, base) == {"tinyworld_fidelity": declared_floor("tinyworld_fidelity").value}  # the registry's
    mine = resolve_config("tiny", "sol_rl", sets=["run.hacking_floors.tinyworld_fidelity=0.01"])
    assert floors(mine, base) == {"tinyworld_fidelity": 0.01}  # settable per run
    assert PLUGIN_FLOOR.resolve(0.2) == pytest.approx(0.1)  # a share of the base images' spread


def test_on_hacking_replaces_stop_on_hacking_which_still_reads_as_stop():
    assert resolve_config("tiny", "sol_rl").run.hacking_action == "warn"
    assert resolve_config("tiny", "sol_rl", sets=["run.stop_on_hacking=true"]).run.hacking_action == "stop"
    for bad, said in ((["run.on_hacking=rolback"], "did you mean 'rollback'"),
                      (["run.hacking_floors.tinyworld_fidelty=0.1"], "not an eval reward"),
                      (["run.stop_on_hacking=true", "run.on_hacking=rollback"], "contradicts")):
        with pytest.raises(SolrlError) as err:
            resolve_config("tiny", "sol_rl", sets=bad)
        assert said in err.value.message + err.value.fix


def test_after_an_evaluation_one_decision_goes_on_stops_or_rolls_back_with_the_rule_that_stopped_it():
    class Found:  # what an evaluation leaves on the run's RunEvals
        def __init__(self, hacked: bool, short: list[str]) -> None:
            self.hacked, self.short = hacked, short

    def after(on_hacking: str, hacked: bool, short: bool = False, dropped: bool = False) -> AfterEval:
        run = resolve_config("tiny", "sol_rl", sets=[f"run.on_hacking={on_hacking}"]).run
        return after_evaluation(run, Found(hacked, ["tinyworld_fidelity"] if short else []), dropped)

    assert after("warn", hacked=False) == AfterEval(Next.GO_ON) and not AfterEval(Next.GO_ON).stops
    assert after("warn", hacked=True) == AfterEval(Next.GO_ON)  # warned of, by the evaluation
    assert after("stop", hacked=True) == AfterEval(Next.STOP, "run.on_hacking=stop")
    # nowhere to go: stops
    assert after("rollback", hacked=True) == AfterEval(Next.ROLL_BACK, "run.on_hacking=rollback")
    assert after("rollback", hacked=True).stops and after("stop", hacked=True, short=True).rule == "run.on_hacking=stop"
    assert after("warn", hacked=True, short=True) == AfterEval(Next.STOP, "run.min_trade")
    assert after("stop", hacked=False, dropped=True) == AfterEval(Next.STOP)  # a stop request's: no rule, exit 130
    run = resolve_config("tiny", "sol_rl", sets=["run.iterations=7", "run.eval_every=3", "run.checkpoint_every=2"]).run
    assert [i for i in range(1, 8) if evaluation_due(run, i, True)] == [3, 6, 7]
    assert not any(evaluation_due(run, i, False) for i in range(1, 8))
    assert [i for i in range(1, 8) if checkpoint_due(run, i, False, False, False)] == [2, 4, 6, 7]
    assert all(checkpoint_due(run, 1, *due)
               for due in ((True, False, False), (False, True, False), (False, False, True)))


class FallAt:
    """The rule, constructed: the evaluation of iteration `at` falls, until the run has rolled back once."""

    def __init__(self, at: int, done: bool = False) -> None:
        self.at, self.iteration, self.done = at, 0, done

    def watch(self, e: ev.Event) -> None:
        if isinstance(e, ev.IterationFinished):
            self.iteration = e.iteration
        elif isinstance(e, ev.RolledBack):
            self.done = True

    def __call__(self, base: Evaluation, now: Evaluation, floor: dict[str, float]) -> list[Fall]:
        fell = self.iteration == self.at and not self.done and now is not base
        return [Fall("tinyworld_fidelity", -0.5, 0.01, floor["tinyworld_fidelity"])] if fell else []


def _train(sets, rule, resume=False, stop_after_rollback=None):
    seen, flag, bus = [], StopFlag(), ev.EventBus()
    bus.subscribe(seen.append)
    bus.subscribe(rule.watch)
    if stop_after_rollback is not None:
        bus.subscribe(lambda e: setattr(flag, "requested", True) if isinstance(e, ev.IterationFinished)
                      and e.iteration == stop_after_rollback and rule.done else None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("solrl_core.loop.run_eval.flagged", rule)
        session = train(resolve_config("tiny", "sol_rl", sets=sets), bus, resume=resume, stop=flag)
    return session, seen


ROLLBACK = ("run.iterations=4", "run.eval_every=2", "run.checkpoint_every=1", "run.keep_checkpoints=1",
            "sampler.eval_steps=2",
            "run.on_hacking=rollback", "run.rollback_then=lower_lr")


@pytest.fixture(scope="module")
def rolled(tmp_path_factory):
    """A run whose evaluation of iteration 4 falls once: it rolls back to iteration 2 and goes on at half the lr."""
    tmp = tmp_path_factory.mktemp("hacking")
    (tmp / "ev.txt").write_text(CAPTIONS)
    sets = [*FAST, f"run.eval_prompts={tmp / 'ev.txt'}", *ROLLBACK]
    session, seen = _train([*sets, f"run.run_dir={tmp / 'a'}"], FallAt(4))
    return tmp, sets, session, seen


@pytest.mark.slow  # three runs of six iterations and four evaluations
def test_rollback_returns_to_the_last_checkpoint_evaluated_clean_and_resumes_exactly(rolled):
    tmp, sets, straight, seen = rolled
    hacking = [e for e in seen if isinstance(e, ev.RewardHacking)]
    assert [(e.iteration, e.action, e.floor > 0) for e in hacking] == [(4, "rollback", True)]
    (back,) = [e for e in seen if isinstance(e, ev.RolledBack)]
    lr = straight.run.config.optimizer.lr
    assert (back.iteration, back.to, back.then, back.rollbacks, back.lr) == (4, 2, "lower_lr", 1, pytest.approx(lr / 2))
    # iteration 2 survived keep_checkpoints=1 as the newest checkpoint an evaluation passed; iteration 3 after it is set
    # aside
    assert back.checkpoint.endswith("iter_000002") and [p.split("-")[:2]
                                                        for p in back.set_aside] == [["superseded", "iter_000003"]]
    assert [e.iteration for e in seen if isinstance(e, ev.IterationFinished)] == [1, 2, 3, 4, 3, 4]
    assert straight.state.rollbacks == 1 and straight.run.optimizer.param_groups[0]["lr"] == pytest.approx(lr / 2)
    verdicts = json.loads((tmp / "a" / "checkpoints" / "iter_000004" / "trainer_state.json").read_text())["evaluations"]
    assert [(v["iteration"], v["flagged"]) for v in verdicts] == [(0, []), (2, []), (4, [])]  # the fall was undone
    # the same run stopped after the rollback's iteration 3 and resumed: the same weights and rewards
    _train([*sets, f"run.run_dir={tmp / 'b'}"], FallAt(4), stop_after_rollback=3)
    resumed, again = _train([*sets, f"run.run_dir={tmp / 'b'}"], FallAt(4, done=True), resume=True)
    assert [e.iteration for e in again if isinstance(e, ev.IterationFinished)] == [4]
    assert resumed.state.rollbacks == 1 and resumed.run.optimizer.param_groups[0]["lr"] == pytest.approx(lr / 2)
    assert resumed.state.history == pytest.approx(straight.state.history, abs=1e-7)
    for which in ("default", "old", "ema"):
        a, b = straight.run.engine.policy.state(which), resumed.run.engine.policy.state(which)
        assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), which


def _solrl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "solrl_cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _verdict(checkpoint, gain, flagged_rewards, changes=None):
    """Rewrite a checkpoint's own evaluation verdict (and its manifest, so it stays intact)."""
    path = checkpoint / "trainer_state.json"
    state = json.loads(path.read_text())
    state["evaluations"] = [e for e in state.get("evaluations", []) if e["iteration"] != state["iteration"]]
    state["evaluations"].append({"iteration": state["iteration"], "gain": gain, "se": 0.01, "flagged": flagged_rewards,
                                 **({"changes": changes} if changes is not None else {})})
    path.write_text(json.dumps(state))
    (checkpoint / "manifest.json").unlink()
    write_manifest(checkpoint)


def _flag(checkpoint, flagged_rewards):
    """Rewrite which eval rewards a checkpoint's own evaluation verdict flagged (and its manifest, so it
    stays intact); its gain stays the one the run's events record (hacking.Verdicts believes no other)."""
    path = checkpoint / "trainer_state.json"
    state = json.loads(path.read_text())
    own = next(e for e in state["evaluations"] if e["iteration"] == state["iteration"])
    own["flagged"] = flagged_rewards
    path.write_text(json.dumps(state))
    (checkpoint / "manifest.json").unlink()
    write_manifest(checkpoint)
    return own["gain"]


@pytest.mark.slow  # four solrl processes, one of them an evaluation
def test_best_picks_the_highest_gain_no_rule_flagged_and_the_card_says_why(rolled):
    tmp, _, _, _ = rolled
    run = tmp / "a"
    found = sorted((run / "checkpoints").glob("iter_*"))
    assert len(found) >= 2 and found[-1].name == "iter_000004"
    gains = {path.name: _flag(path, []) for path in found[:-1]}
    _flag(found[-1], ["tinyworld_fidelity"])  # the last, flagged
    best = max(gains, key=lambda name: (gains[name], name))
    done = _solrl("export", str(run), "--best", "--out", str(tmp / "x"), cwd=tmp)
    assert done.returncode == 0, done.stderr
    assert (f"--best: {best}: the highest trained-reward gain" in done.stdout and "flagged: iter_000004 "
                                                                                  "(tinyworld_fidelity)" in done.stdout)
    assert "warning:" not in done.stdout  # every verdict is the one the run's events record
    card = (tmp / "x" / "README.md").read_text()
    assert (f"| checkpoint | chosen by --best: {best}: the highest trained-reward gain since the base "
            f"({gains[best]:+.4f}" in card)
    scored = _solrl("eval", str(run), "--best", "--prompts", str(tmp / "ev.txt"), "--seeds", "1", "--steps", "2",
                    "--rewards", "",
                    "--out", str(tmp / "e"), cwd=tmp)
    assert scored.returncode == 0, scored.stderr
    assert f"--best: {best}" in scored.stdout and f"solrl eval  {run / 'checkpoints' / best}" in scored.stdout
    both = _solrl("export", str(run), "--best", "--checkpoint", "iter_000004", cwd=tmp)
    assert both.returncode == 2 and "drop --checkpoint" in both.stderr
    for path in found[:-1]:
        _flag(path, ["tinyworld_fidelity"])
    none = _solrl("export", str(run), "--best", cwd=tmp)
    assert (none.returncode == 2 and "--best found no checkpoint" in none.stderr and "Traceback" not in none.stdout
            + none.stderr)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A run evaluated at each of its two iterations: checkpoints holding their verdicts, and the events
    that bear them out."""
    tmp = tmp_path_factory.mktemp("evaluated")
    (tmp / "ev.txt").write_text(CAPTIONS)
    sets = [*FAST, f"run.eval_prompts={tmp / 'ev.txt'}", "run.iterations=2", "run.eval_every=1",
            "run.checkpoint_every=1", "sampler.eval_steps=2", f"run.run_dir={tmp / 'a'}"]
    train(resolve_config("tiny", "sol_rl", sets=sets), ev.EventBus())
    return tmp / "a"


def test_a_verdict_whose_eval_reward_changes_its_event_does_not_record_is_not_used(evaluated, tmp_path):
    """The frontier walk reads each verdict's eval-reward changes: a changed one (in trainer_state.json,
    manifest and all) is not borne out by events.jsonl, so --best leaves it out, naming the checkpoint."""
    import shutil

    from solrl_core.loop.hacking import Verdicts, checkpoint_verdict

    run = shutil.copytree(evaluated, tmp_path / "a")
    path = sorted((run / "checkpoints").glob("iter_*"))[-1]
    v = checkpoint_verdict(path)
    assert v is not None and v["changes"] and Verdicts(run).of(path) == (v, "")  # borne out as written
    _verdict(path, v["gain"], v["flagged"], changes={k: x + 0.5 for k, x in v["changes"].items()})
    got, line = Verdicts(run).of(path)
    assert got is None and line.startswith(f"{path.name}'s trainer_state.json") and "eval rewards' changes" in line


def test_best_walks_the_frontier_at_the_runs_min_trade(evaluated, monkeypatch):
    """--best with run.min_trade set: among unflagged checkpoints, the frontier walk stops before a step
    whose gain cost too much of an eval reward (loop/frontier.py), and the sentence says so. The verdicts
    written here are taken as borne out (checking them against events.jsonl is test_nothing_forged's)."""
    import tomli_w
    import tomllib

    from solrl_core.loop import hacking
    from solrl_core.loop.hacking import best_checkpoint

    monkeypatch.setattr(hacking.Verdicts, "of", lambda self, checkpoint: (hacking.checkpoint_verdict(checkpoint), ""))

    run = evaluated
    found = sorted((run / "checkpoints").glob("iter_*"))
    assert len(found) >= 2
    for i, path in enumerate(found):  # gains rising, fidelity falling faster and faster
        _verdict(path, 0.03 + 0.01 * i, [], changes={"tinyworld_fidelity": -0.01 - 0.05 * i * i})
    assert best_checkpoint(run)[0] == found[-1]  # min_trade 0: the highest gain
    config = tomllib.loads((run / "config.toml").read_text())
    config["run"]["min_trade"] = 0.5
    (run / "config.toml").write_text(tomli_w.dumps(config))
    path, why, _ = best_checkpoint(run)
    assert path == found[0] and f"the frontier walk stopped before iteration {int(found[1].name[5:])}" in why
