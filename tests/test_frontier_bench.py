"""benchmarks/frontier.py's logic on stubbed runs (no training): the selection of points and seeds, the
resumable results file, the mean and spread over seeds, the table and the figure."""

from __future__ import annotations

import json
import math
import sys

import pytest

from tests.conftest import BENCHMARKS


@pytest.fixture
def frontier(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("frontier", None)
    import frontier as module

    return module


def _stub(calls):
    """A trainer whose figures are a function of the overrides and the seed, recording every call."""
    def run(sets, seed):
        calls.append((tuple(sets), seed))
        lr_point = any(s.startswith("optimizer.lr") for s in sets)
        return {"gain": 0.04 + 0.01 * seed - (0.02 if lr_point else 0.0), "fidelity_change": -0.08 + 0.01 * seed,
                "iteration": 30, "last_iteration": 30, "flagged": False,
                "kinds": {"object": 0.0, "count": 0.05 + 0.01 * seed, "binding": 0.03,
                          "position": -0.01 if seed == 2 else 0.02},
                "base_kinds": {"object": 1.0, "count": 0.4, "binding": 0.5, "position": 0.5},
                "gain_se": 0.006, "grain": 1.0 + 0.1 * seed, "train_s": 100.0 + seed, "wall_s": 130.0,
                "device": "cpu (stub)", "load": "1.00 -> 1.00",
                "command": "stub"}
    return run


def _digest(sets):
    """A stand-in for the config digest: the overrides themselves (no preset is resolved)."""
    return "|".join(sets) or "preset"


def test_a_sweep_runs_what_is_missing_resumes_and_summarises_over_seeds(frontier, tmp_path, capsys):
    results, calls = tmp_path / "r.json", []
    argv = ["--points", "default", "lr_1e-4", "--seeds", "0", "1", "--iterations", "10", "--results", str(results),
            "--figure", str(tmp_path / "f.png"), "--table", str(tmp_path / "t.md")]
    rows = frontier.main(argv, trainer=_stub(calls), digest=_digest)
    assert [(s, seed) for s, seed in calls] == [(("run.iterations=10",), 0), (("run.iterations=10",), 1),
                                                (("run.iterations=10", "optimizer.lr=1e-4"), 0),
                                                (("run.iterations=10", "optimizer.lr=1e-4"), 1)]
    assert len(json.loads(results.read_text())["runs"]) == 4
    # again with a third seed: only the new runs train
    rows = frontier.main([*argv[:4], "0", "1", "2", *argv[6:]], trainer=_stub(calls), digest=_digest)
    assert [seed for _, seed in calls[4:]] == [2, 2]
    default = rows[0]
    assert default["point"] == "default" and default["n"] == 3
    assert default["gain"][0] == pytest.approx(0.05) and default["gain"][1] == pytest.approx(0.01)  # 0.04, 0.05, 0.06
    assert default["fidelity_change"] == (pytest.approx(-0.07), pytest.approx(0.01))
    assert default["kinds"]["count"][0] == pytest.approx(0.06) and math.isclose(default["kinds"]["object"][1], 0.0)
    assert default["every_kind_up"] is False  # position fell on seed 2 (object, at its ceiling, only must not fall)
    assert frontier.summarise(frontier.load_results(results), [("default", [])], [0, 1], ["run.iterations=10"],
                              _digest)[0]["every_kind_up"]
    assert rows[1]["gain"][0] == pytest.approx(0.03)
    text = (tmp_path / "t.md").read_text()
    assert "device: cpu (stub)" in text and "load (uptime, now):" in text and "command: " in text
    assert "| default | (preset) | 3 | +0.0500 +- 0.0100 | -0.0700 +- 0.0100 |" in text
    assert "| lr_1e-4 | optimizer.lr=1e-4 | 3 |" in text and "| no | 1.10 +- 0.10 | 30 |" in text
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the report alone trains nothing
    before = len(calls)
    frontier.main([*argv, "--report-only"], trainer=_stub(calls), digest=_digest)
    assert len(calls) == before and "| default |" in capsys.readouterr().out


def test_points_are_named_or_written_out_and_a_bad_one_is_refused(frontier):
    assert frontier.parse_point("kl_0.01") == ("kl_0.01", ["algorithm.kl_beta=0.01"])
    assert frontier.parse_point("mine=optimizer.lr=2e-4; run.iterations=10") == ("mine", ["optimizer.lr=2e-4",
                                                                                          "run.iterations=10"])
    for bad in ("nope", "=a.b=1", "x=lr"):
        with pytest.raises(Exception):
            frontier.parse_point(bad)
    args = frontier.parse_args(["--point", "mine=optimizer.lr=2e-4"])
    assert [n for n, _ in args.points] == ["mine"]  # a point of your own alone runs alone
    assert [n for n, _ in frontier.parse_args([]).points] == list(frontier.POINTS)
    assert frontier.run_key("p", "abc", 0) != frontier.run_key("p", "abd", 0) != frontier.run_key("p", "abc", 1)


def test_a_run_is_keyed_by_the_whole_config_it_trained_with(frontier):
    """A run measured before the preset changed is not the changed preset's: the key digests the resolved
    config, not the overrides alone (the tiny preset's kl_beta moved from the official 1e-4 to 0.1)."""
    digest = frontier.config_digest("tiny")
    assert digest([]) == digest(["algorithm.kl_beta=0.1"]) == digest(["run.seed=7", "run.device=cpu"])
    assert digest([]) != digest(["algorithm.kl_beta=1e-4"]) != digest(["algorithm.kl_beta=1e-4", "run.iterations=3"])
    assert frontier.POINTS["kl_1e-4"] == ["algorithm.kl_beta=1e-4"]
