"""`solrl compare` reads recorded events.jsonl files: a table of the numbers and one PNG."""

import csv

import pytest
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core import events as ev
from solrl_core.errors import SolrlError
from solrl_core.tracking.compare import load_run
from tests.helpers import record_events as _record


def test_load_run_drops_what_a_resume_repeats_and_sums_measured_seconds(tmp_path):
    _record(tmp_path, "sol_rl", [0.5, 0.6, 0.7], seconds=3.0, resume_at=1)
    run = load_run(tmp_path)
    its, secs, means = run.series("mean")
    assert its == [1, 2, 3] and means == [0.5, 0.6, 0.7]  # the lost iteration 2 (reward 99) is gone
    assert secs == pytest.approx([5.0, 8.0, 11.0])  # base eval 2 s, then 3 s per iteration
    assert [t.elapsed for t in run.evals] == pytest.approx([2.0, 13.0])
    assert run.phase_means()["explore"] == pytest.approx(1.5)


def test_compare_writes_png_and_table(tmp_path):
    a, b, out = tmp_path / "sol", tmp_path / "naive", tmp_path / "out"
    a.mkdir(), b.mkdir()
    _record(a, "sol_rl", [0.5, 0.6, 0.7], seconds=3.0)
    _record(b, "naive_scaling", [0.5, 0.55], seconds=6.0)
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "naive_scaling" in result.output and "sol_rl" in result.output
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    rows = list(csv.reader(open(out / "compare.csv")))
    assert rows[1][:9] == ["sol", "sol_rl", "cpu", "3/3", "0.5", "0.6", "0.5", "0.7", "13.0"]
    assert rows[2][3] == "2/2" and rows[2][rows[0].index("total s/it")] == "6.000"


def test_a_newer_kind_is_skipped_and_counted_and_a_damaged_line_is_named(tmp_path):
    _record(tmp_path, "sol_rl", [0.5, 0.6], seconds=3.0)
    with open(tmp_path / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"event": "from_the_future", "time": 1.0, "x": 1}\n')
    run = load_run(tmp_path)
    assert run.skipped == {"from_the_future": 1} and len(run.iterations) == 2
    with open(tmp_path / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"event": "eval", "time": 1.0, "iteration": 2}\n')  # a known kind missing its fields
    with pytest.raises(SolrlError, match="line 7 is damaged: event 'eval' does not fit its fields"):
        load_run(tmp_path)


def test_compare_names_a_folder_without_events(tmp_path):
    with pytest.raises(SolrlError, match="has no events.jsonl"):
        load_run(tmp_path)


@pytest.mark.slow
def test_compare_two_tiny_runs(fast_sets, tmp_path):
    from solrl_core.config.presets import resolve_config
    from solrl_core.loop.trainer import train

    for family in ("sol_rl", "naive_scaling"):
        sets = fast_sets("run.iterations=2", "run.eval_prompts=", run_dir=family)
        train(resolve_config("tiny", family, sets=sets), ev.EventBus())
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "sol_rl"), str(tmp_path / "naive_scaling"), "--out",
                                      str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(open(tmp_path / "cmp" / "compare.csv")))
    assert [r[1] for r in rows[1:]] == ["sol_rl", "naive_scaling"] and [r[3] for r in rows[1:]] == ["2/2", "2/2"]
    regenerate = rows[0].index("regenerate s/it")
    assert float(rows[1][regenerate]) > 0 and float(rows[2][regenerate]) == 0  # only sol_rl regenerates
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 20_000
