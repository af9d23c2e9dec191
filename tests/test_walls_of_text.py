"""What a command prints fits what it is for: help in words, not Python types; settings filtered, with
the chosen preset's values, none cut; bench tables whole when piped; no MFU above 100%."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from solrl_cli.app import app

runner = CliRunner()
TYPE_LABEL = re.compile(r"<(?:str|int|float|bool|path|list\[[^\]]*\]|[a-z]+ range)>")


@pytest.mark.parametrize("command", [name for name, *_ in [(c.name,) for c in app.registered_commands]])
def test_help_shows_no_python_type_labels(command):
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    # Typer labels its own --help `<bool>` and an argument's type whatever its metavar (no public setting
    # changes either): every option of ours is checked
    ours = [line for line in result.output.splitlines() if re.match(r"│ +-", line) and "Show this message and exit" not in line]
    assert not [line for line in ours if TYPE_LABEL.search(line)], result.output
    if command == "train":
        assert re.search(r"--set\s+-s\s+TEXT\s", result.output) and re.search(r"--tui\s+Watch", result.output)
