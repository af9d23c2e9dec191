"""The trade between alignment and damage (loop/frontier.py): the gain each stretch bought per unit of an
eval reward lost, the early stop on it (run.min_trade) and the frontier walk --best takes. CPU, no network."""

from __future__ import annotations

import json

import pytest

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine.state_schema import read_trainer_state
from solrl_core.errors import SolrlError
from solrl_core.loop.frontier import RULE, frontier, frontier_choice, previous, too_little, trade
from solrl_core.loop.trainer import train

F = "tinyworld_fidelity"


def _v(iteration: int, gain: float, fid: float | None) -> dict:
    v = {"iteration": iteration, "gain": gain, "se": 0.005, "flagged": []}
    return v if fid is None else {**v, "changes": {F: fid}}


def test_the_trade_is_the_gain_since_the_last_evaluation_per_unit_lost_beyond_noise():
    before = _v(3, 0.037, -0.027)
    # +0.009 gain for 0.060 more fidelity lost: 0.15 per unit (the default tiny run, iterations 3 -> 30)
    assert trade(before, 0.046, {F: -0.087}, {F: 0.0005}, 2.0) == {F: pytest.approx(0.15)}
    assert trade(None, 0.037, {F: -0.027}, {F: 0.0005}, 2.0) == {F: pytest.approx(0.037 / 0.027)}  # since the base
    assert trade(before, 0.05, {F: -0.020}, {F: 0.0005}, 2.0) == {}  # fidelity rose: nothing lost
    assert trade(before, 0.05, {F: -0.0275}, {F: 0.0005}, 2.0) == {}  # a fall within two standard errors: noise
    assert trade(before, 0.030, {F: -0.037}, {}, 2.0) == {F: pytest.approx(-0.7)}  # lost and gained nothing
    assert trade(_v(3, 0.037, None), 0.05, {F: -0.1}, {}, 2.0) is None  # an older verdict: unmeasured
    assert too_little({F: 0.15}, 0.5) == [F] and too_little({F: 0.15}, 0.1) == [] and too_little({F: 0.15}, 0) == []
    assert too_little(None, 0.5) == [] and too_little({}, 0.5) == []
    verdicts = [_v(0, 0.0, 0.0), _v(10, 0.02, -0.01), _v(20, 0.03, -0.02)]
    assert previous(verdicts, 20)["iteration"] == 10 and previous(verdicts, 11)["iteration"] == 10
    assert previous(verdicts, 0) is None


def test_the_frontier_walk_stops_where_a_step_buys_too_little():
    runs = [_v(3, 0.037, -0.027), _v(10, 0.040, -0.050), _v(20, 0.030, -0.060),  # 20: dominated by 10
            _v(30, 0.046, -0.087)]
    assert [v["iteration"] for v in frontier(runs)] == [3, 10, 30]
    chosen, why = frontier_choice(runs, 0.0)  # off: the highest gain, as --best took before
    assert chosen["iteration"] == 30 and why == ""
    chosen, why = frontier_choice(runs, 0.5)  # 3 -> 10 bought 0.003 for 0.023 (0.13 per unit): stop at 3
    assert chosen["iteration"] == 3 and RULE in why and "before iteration 10" in why and "0.13 per unit" in why
    chosen, _ = frontier_choice(runs, 0.1)  # 3 -> 10 passes (0.13); 10 -> 30 bought 0.006 for 0.037 (0.16): passes
    assert chosen["iteration"] == 30
    # the walk stops at the first dear step, however cheap the next
    assert frontier_choice(runs, 0.14)[0]["iteration"] == 3
    # no changes kept (no eval rewards, or an older run): the highest gain, the newest on a tie
    plain = [_v(2, 0.1, None), _v(4, 0.3, None), _v(6, 0.3, None), _v(8, 0.2, None)]
    assert frontier_choice(plain, 0.5)[0]["iteration"] == 6
    # a tie of gains: the one that lost less
    assert frontier_choice([_v(2, 0.3, -0.01), _v(4, 0.3, -0.05)], 0.0)[0]["iteration"] == 2
    with pytest.raises(ValueError):
        frontier_choice([], 0.0)


def test_a_verdict_keeps_its_changes_and_the_state_schema_checks_them(tmp_path):
    ckpt = tmp_path / "iter_000002"
    ckpt.mkdir()
    state = {"iteration": 2, "step": 2, "history": [0.1, 0.2], "evaluations": [_v(0, 0.0, 0.0), _v(2, 0.02, -0.01)]}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    assert read_trainer_state(ckpt)["evaluations"][1]["changes"] == {F: -0.01}
    state["evaluations"][1]["changes"] = {F: "a lot"}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(SolrlError) as err:
        read_trainer_state(ckpt)
    assert '"evaluations"[1]' in err.value.message
    with pytest.raises(SolrlError) as err:
        resolve_config("tiny", "sol_rl", sets=["run.min_trade=-1"])
    assert "run.min_trade" in err.value.message


def test_pruning_spares_the_checkpoint_the_frontier_walk_names():
    """keep_checkpoints prunes older checkpoints but spares --best's: at run.min_trade > 0 that is the
    frontier walk's choice, which need be neither the newest nor the highest gain."""
    from solrl_core.loop.hacking import spared

    runs = [_v(0, 0.0, 0.0), _v(3, 0.037, -0.027), _v(10, 0.040, -0.050), _v(30, 0.046, -0.087)]
    assert spared(runs) == {"iter_000030"}  # off: the newest is the highest gain
    assert spared(runs, 0.5) == {"iter_000030", "iter_000003"}  # the walk stops at 3 (3 -> 10: 0.13 per unit)


def test_min_trade_stops_the_run_at_the_evaluation_whose_stretch_bought_too_little(fast_sets, monkeypatch):
    """The early stop, constructed: the evaluation of iteration 2 reports a dear trade; the run stops there
    with a checkpoint, the event carries the trade and the verdicts their changes."""
    real = trade

    def dear(before, gain, changes, se, significance):  # type: ignore[no-untyped-def]
        measured = real(before, gain, changes, se, significance)
        return {F: 0.01} if before is not None and before["iteration"] == 1 else measured

    monkeypatch.setattr("solrl_core.loop.run_eval.trade", dear)
    seen, bus = [], ev.EventBus()
    bus.subscribe(seen.append)
    cfg = resolve_config("tiny", "sol_rl",
                         sets=fast_sets("run.iterations=4", "run.eval_every=1", "sampler.eval_steps=2",
                                                           "run.min_trade=0.5"))
    session = train(cfg, bus)
    assert session.state.iteration == 2  # stopped at the second evaluation, not run to 4
    # an automatic stop: `solrl train` exits 3, not Ctrl-C's 130
    assert session.state.stopped_by_rule == "run.min_trade"
    evals = {e.iteration: e for e in seen if isinstance(e, ev.EvalFinished)}
    assert sorted(evals) == [0, 1, 2] and evals[2].trade == {F: 0.01} and evals[2].trade_since == 1
    assert evals[0].trade_since == -1 and evals[1].trade_since == 0
    assert any(isinstance(e, ev.RunWarning) and "below run.min_trade 0.5" in e.message for e in seen)
    from solrl_core.tracking.metrics import scalars

    assert scalars(evals[2])[1][f"eval_reward/{F}/trade"] == 0.01  # TensorBoard and W&B
    state = json.loads((session.run.run_dir / "checkpoints" / "iter_000002" / "trainer_state.json").read_text())
    assert [(v["iteration"], sorted(v["changes"])) for v in state["evaluations"]] == [(0, [F]), (1, [F]), (2, [F])]
    assert state["evaluations"][0]["changes"] == {F: 0.0}
