"""benchmarks/threads.py: each setting's overrides and environment, the busy/alone table, and a
tiny run end to end (alone and beside one burner, through `python -m solrl_cli train`). Nothing
here checks a timing."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FAST


@pytest.fixture
def bench(benchmark_module):
    return benchmark_module("threads")


def test_settings_reproduce_the_old_default_and_leave_auto_alone(bench, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    sets, env = bench.setting_env("old", 2)
    assert sets == ["run.threads=2"] and env["GOMP_SPINCOUNT"] == "300000"  # libgomp's default spin, written out
    assert "OMP_WAIT_POLICY" not in env and "OMP_NUM_THREADS" not in env
    sets, env = bench.setting_env("auto", 2)
    assert sets == ["run.threads=0"] and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS"} & set(env)
    assert bench.setting_env("1", 16)[0] == ["run.threads=1"]
    # auto as it was before CPU lanes
    assert bench.setting_env("no-lanes", 2)[0] == ["run.threads=0", "run.lanes=false"]


def test_bad_counts_are_refused(bench):
    for args in (["--burners", "0"], ["--iterations", "0"], ["--nproc-per-node", "0"], ["--settings", "two"]):
        with pytest.raises(SystemExit):
            bench.parse_args(args)


def test_the_table_gives_busy_over_alone_per_setting(bench):
    def run(setting, burners, seconds, nproc=1):
        return {"setting": setting, "burners": burners, "nproc": nproc, "seconds": seconds, "load_at_start": 0.5,
                "threads": f"torch threads {setting}"}

    runs = [run("old", 0, 10.0), run("old", 2, 45.0), run("auto", 0, 8.0), run("auto", 2, 12.0),
            run("auto", 0, 30.0, nproc=4)]
    assert bench.summary(runs, 2) == [
        "| old | torch threads old | 10.0 (load 0.5) | 45.0 (load 0.5) | 4.50x |",
        "| auto | torch threads auto | 8.0 (load 0.5) | 12.0 (load 0.5) | 1.50x |",
    ]


@pytest.mark.slow
def test_a_tiny_run_is_timed_alone_and_beside_a_burner(bench, tmp_path, capsys):
    out = tmp_path / "threads.json"
    small = [x for s in FAST if not s.startswith("run.threads=") for x in ("--set", s)]  # the setting decides threads
    bench.main(["--settings", "auto", "--iterations", "1", *small, "--json", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert [(r["setting"], r["burners"]) for r in runs] == [("auto", 0), ("auto", 1)]
    for r in runs:
        assert len(r["iterations"]) == 1 and r["seconds"] > 0
        assert set(r["phases"]) == {"explore", "regenerate", "train"} and all(v > 0 for v in r["phases"].values())
        assert r["threads"].startswith("torch threads ") and "(auto: " in r["threads"]
    text = capsys.readouterr().out
    assert ("| setting | threads | alone s | beside 1 burner(s) s | busy/alone |" in text and "\n| auto | torch "
                                                                                              "threads " in text)
