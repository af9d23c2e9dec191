"""benchmarks/gpu_iteration.py runs `solrl train`'s code end to end at tiny size on a CPU and reports
phases, peak memory and ratios against the compiled baseline. Nothing here checks a timing."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def gpu_iteration(benchmark_module):
    return benchmark_module("gpu_iteration")


def test_families_train_through_the_same_code_at_tiny_size(gpu_iteration, tmp_path, capsys):
    out = tmp_path / "it.json"
    gpu_iteration.main(["--size", "tiny", "--device", "cpu", "--models", "sana", "--families", "sol_rl",
                        "naive_scaling",
                        "--n", "4", "--k", "2", "--rollout-batch", "4", "--iterations", "2", "--warmup", "1",
                        "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["family"] for r in rows] == ["sol_rl", "naive_scaling"]
    sol, naive = rows
    assert sol["seconds"]["regenerate"] > 0 and naive["seconds"]["regenerate"] == 0
    assert all(r["peak_gib"]["total"] > 0 and r["iterations_measured"] == 1 for r in rows)
    assert "rollout copy on" in sol["machine"] and "update eager" in sol["machine"]
    assert all(r["estimate_gib"] is None for r in rows)  # an estimate of the real SANA-1.6B: not for a tiny model
    text = capsys.readouterr().out
    assert "no ratio against the compiled baseline" in text and "shown at --size real only" in text


def test_ratios_are_against_the_compile_family(gpu_iteration, capsys):
    def row(family, explore, regenerate, total):
        return {"model": "sana", "family": family,
                "seconds": {"explore": explore, "regenerate": regenerate, "reward": 0.0,
                                                               "train": 1.0, "sync": 0.0, "total": total},
                "peak_gib": {"total": 1.0}, "memory_source": "cuda peak allocated", "compile_seconds": {},
                "iterations_measured": 2}

    rows = [row("sol_rl", 2.0, 1.0, 6.0), row("compile", 6.0, 0.0, 9.0)]
    rows[0]["estimate_gib"] = 12.5
    gpu_iteration.report(rows, "cuda:0 (test)")
    text = capsys.readouterr().out
    assert "sol_rl vs compile: total 1.50x, rollout (explore + regenerate) 2.00x" in text
    assert "1.00       12.50  -" in text and "doctor est" in text  # the estimate next to the measured peak


def test_each_compile_mode_is_timed_in_turn(gpu_iteration, tmp_path):
    out = tmp_path / "modes.json"
    gpu_iteration.main(["--size", "tiny", "--device", "cpu", "--models", "sana", "--families", "sol_rl", "--n", "4",
                        "--k", "2",
                        "--rollout-batch", "4", "--iterations", "2", "--warmup", "1", "--json", str(out),
                        "--compile-mode", "default", "max-autotune-no-cudagraphs"])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["compile_mode"]) for r in rows] == [("sana [default]", "default"),
                                                              ("sana [max-autotune-no-cudagraphs]",
                                                               "max-autotune-no-cudagraphs")]
    with pytest.raises(SystemExit):
        gpu_iteration.main(["--compile-mode", "reduce-overhead"])
