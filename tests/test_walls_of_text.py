"""What a command prints fits what it is for: help in words, not Python types; settings filtered, with
the chosen preset's values, none cut; bench tables whole when piped; no MFU above 100%."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from solrl_cli.app import app

runner = CliRunner()
TYPE_LABEL = re.compile(r"<(?:str|int|float|bool|path|Path|file|dir|list\[[^\]]*\]|[a-z]+ range)>")


@pytest.mark.parametrize("command", [name for name, *_ in [(c.name,) for c in app.registered_commands]] + [None])
def test_help_shows_no_python_type_labels(command):
    """Every option and argument, Typer's own --help and the app's --version included: no `<bool>`,
    `<path>` or `<list[Path]>`; arguments go by their upper-case names."""
    result = runner.invoke(app, [command, "--help"] if command else ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if re.match(r"│ +(\* +)?[-A-Za-z]", line)]
    assert rows and not [line for line in rows if TYPE_LABEL.search(line)], result.output
    assert re.search(r"--help\s+-h\s+Show this message and exit", result.output), result.output
    if command == "train":
        assert re.search(r"--set\s+-s\s+TEXT\s", result.output) and re.search(r"--tui\s+Watch", result.output)
    if command == "compare":
        assert re.search(r"│ +\* +RUNS +Run folders", result.output) and "{RUNS}..." in result.output


def _bench_row(family: str) -> dict:
    phases = ("explore", "regenerate", "reward", "train", "sync", "total")
    seconds = {p: 0.1734 + i for i, p in enumerate(phases)}
    return {"family": family, "machine": "", "iterations_measured": 3, "estimate_gib": None, "seconds": seconds,
            "spread": {p: [v - 0.0012, v + 0.0391] for p, v in seconds.items()}, "peak_gib": {"total": 1.2345},
            "rates": {"explore": 123.4, "regenerate": 98.76, "train": 54.32, "total": 7.654},
            "flops": {"explore": 1.23e12, "regenerate": 4.56e11, "train": 7.89e11, "total": 2.47e12},
            "mfu": {"explore": 0.123, "regenerate": 0.456, "train": 0.789, "total": 0.321},
            "precision": {"explore": "nvfp4-emulated", "regenerate": "fp32", "train": "fp32"},
            "memory_source": "measured",
            "peak_flops": {}, "vs_compile": None, "compile_seconds": {}, "backoffs": []}


def test_piped_bench_tables_cut_no_number_or_family(monkeypatch):
    """Piped, rich's width is 80 columns: 'naive_scal...' and '0.17-0...' were what a pipe got."""
    from solrl_cli import bench_cmd
    from tests.screens import consoles, printed, tokens

    rows = [_bench_row("naive_scaling"), _bench_row("sol_rl")]
    result = {"model": {"preset": "sana", "size": "tiny", "parameters": 12_345_678, "frames": 0},
              "options": {"n": 8, "k": 4, "warmup": 1}, "rows": rows, "device": "cpu (x86_64, 2 cores)"}
    for console in consoles():
        monkeypatch.setattr(bench_cmd, "console", console)
        bench_cmd._report(result)
        text = printed(console)  # no line over 80 columns, no ellipsis
        found = tokens(text)
        for row in rows:
            assert row["family"] in text.split()
            want = [f"{v:.2f}" for v in row["seconds"].values()] + [f"{100 * v:.1f}" for v in row["mfu"].values()]
            want += [f"{a:.2f}-{b:.2f}" for a, b in row["spread"].values()]
            assert all(w in found or w in text for w in want), (set(want) - set(found), text)


def test_config_help_filters_by_key_and_shows_the_chosen_presets_values():
    tiny = runner.invoke(app, ["config-help", "run.iter"], env={"COLUMNS": "80"})
    assert tiny.exit_code == 0, tiny.output
    # the tiny preset's, not 300
    assert "run.iterations = 30" in tiny.output and "(built-in default: 300)" in tiny.output
    assert "explore." not in tiny.output and len(tiny.output.splitlines()) < 10
    sana = runner.invoke(app, ["config-help", "reward.weights", "--preset", "sana_sol_rl_pickscore"],
                         env={"COLUMNS": "80"})
    assert "settings of sana_sol_rl_pickscore" in sana.output and "reward.weights = {'pickscore': 1.0}" in sana.output
    typo = runner.invoke(app, ["config-help", "explor.stps"])
    assert typo.exit_code == 2 and "did you mean 'explore'" in typo.output and "Traceback" not in typo.output
