"""Input that was accepted silently, or answered with a wall of text or an internal error, gets one
clear line and its fix; end-of-run counts agree with the number of iterations."""

from __future__ import annotations

from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core import events as ev


def cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args))


def test_a_binary_config_file_is_a_clear_error_not_an_internal_one(tmp_path):
    for name, data in (("run.toml", bytes(range(128, 256))), ("pic.yaml", b"\x89PNG\r\n\x1a\n\x00\x00")):
        (tmp_path / name).write_bytes(data)
        result = cli("train", "--config", str(tmp_path / name), "--run-dir", str(tmp_path / "run"))
        assert result.exit_code == 2, result.output
        assert (f"config file {tmp_path / name} is not UTF-8 text" in result.output
                and "internal error" not in result.output)
        assert "fix: give --config a .toml or .yaml text file" in result.output
        assert not (tmp_path / "run").exists()


def test_an_empty_prompt_is_refused():
    for args in (["--prompt", ""], ["--prompt", "a red cube", "--prompt", "   "]):
        result = cli("infer", *args)
        assert result.exit_code == 2, result.output
        assert "error: --prompt is empty" in result.output


def test_a_tracker_named_twice_is_refused(tmp_path):
    result = cli("train", "--set", "run.log=tensorboard,tensorboard", "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert "run.log names tensorboard twice" in result.output and "run.log=tensorboard" in result.output


def test_an_unknown_preset_is_one_line_with_the_closest_names():
    result = cli("train", "--preset", "nope")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[0] == "error: unknown preset 'nope'" and len(lines) == 2 and len(result.output) < 300
    assert "`solrl presets`" in lines[1] and "<model>_<family>_<reward>" in lines[1]
    close = cli("train", "--preset", "tiny_sol_rl_tinyworld")
    assert "did you mean 'tiny_sol_rl_tinyworld_geneval'" in close.output and len(close.output) < 500


def test_the_end_summary_counts_the_iterations_it_averaged():
    from solrl_view.run_summary import end_summary

    def said(iterations: int) -> str:
        return end_summary(ev.RunFinished(reason="completed", iteration=iterations, seconds=1.0, first_reward=0.5,
                                          last3_reward=0.5, run_dir="r"))[0]

    assert "first iteration 0.5, last 1 iteration 0.5" in said(1)
    assert "last 2 iterations 0.5" in said(2) and "last 3 iterations 0.5" in said(30)
