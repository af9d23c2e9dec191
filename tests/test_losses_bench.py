"""benchmarks/losses.py's logic on stubbed runs (no training): a run per loss, family and seed, the runs of
frontier.py's results taken where they trained the same config, resumable, and the table."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import BENCHMARKS


@pytest.fixture
def losses(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("frontier", "losses"):
        sys.modules.pop(name, None)
    import losses as module

    return module


def _record(gain):
    return {"gain": gain, "fidelity_change": -0.01, "iteration": 30, "last_iteration": 30, "flagged": False,
            "kinds": {"count": gain}, "base_kinds": {"count": 0.4}, "gain_se": 0.006, "grain": 1.1, "train_s": 100.0,
            "wall_s": 130.0, "device": "cpu (stub)", "load": "1.00 -> 1.00", "command": "stub"}


def test_each_loss_and_family_trains_once_per_seed_and_the_frontiers_default_is_taken(losses, tmp_path, monkeypatch,
                                                                                         capsys):
    calls = []

    def trainer(args):  # type: ignore[no-untyped-def]
        def run(sets, seed):  # type: ignore[no-untyped-def]
            calls.append((args.family, tuple(sets), seed))
            return _record(0.01 * (1 + len(calls)))
        return run

    monkeypatch.setattr(losses, "train_point", trainer)
    monkeypatch.setattr(losses, "config_digest", lambda model, family: lambda sets: f"{family}:{'|'.join(sets)}")
    reuse, results = tmp_path / "frontier.json", tmp_path / "losses.json"
    reuse.write_text(json.dumps({"runs": {"default|sol_rl:|seed=0": {"point": "default", "config": "sol_rl:",
                                                                     "seed": 0, **_record(0.05)}}}))
    argv = ["--seeds", "0", "1", "--results", str(results), "--reuse", str(reuse)]
    rows = losses.main(argv)
    assert ("sol_rl", (), 0) not in calls and ("sol_rl", (), 1) in calls  # seed 0 of sol_rl/nft: frontier's default
    assert len(calls) == 3 * 2 * 2 - 1
    assert {c[1] for c in calls} == {(), ("algorithm.loss=awm",), ("algorithm.loss=flow_grpo",)}
    assert [r["point"] for r in rows] == ["sol_rl/nft", "sol_rl/awm", "sol_rl/flow_grpo", "diffusionnft/nft",
                                          "diffusionnft/awm", "diffusionnft/flow_grpo"]
    assert rows[0]["n"] == 2 and rows[0]["gain"][0] == pytest.approx((0.05 + 0.02) / 2)
    assert "| family/loss |" in capsys.readouterr().out
    losses.main(argv)  # resumed: nothing left to train
    assert len(calls) == 11
    assert len(json.loads(results.read_text())["runs"]) == 12
