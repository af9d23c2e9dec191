"""The Python API speaks its own words: `solrl.train(prompts=..., eval_prompts=...)`, a string passed as
`sets=` refused with the fix (not split into characters), the CLI's warning filters, and errors that name
the API's arguments rather than command-line flags. Each in a fresh process: the filters are global."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python(cwd: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SOLRL_DEBUG", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_a_string_in_sets_is_refused_with_the_fix_and_the_clis_filters_hold(tmp_path):
    proc = python(tmp_path, """
import solrl
from solrl_core.errors import SolrlError
try:
    solrl.train(sets="run.iterations=1")
except SolrlError as exc:
    print("ERROR", exc.message)
    print("FIX", exc.fix)
import torchao  # registers pytree nodes: torch logs a deprecation for each, which the CLI hides
""")
    assert "ERROR sets= takes a list of 'section.key=value' strings, not one string" in proc.stdout, (proc.stdout
                                                                                                      + proc.stderr)
    assert "FIX write sets=['run.iterations=1']" in proc.stdout
    assert "_pytree" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr


def test_prompts_and_eval_prompts_are_keyword_arguments_named_in_their_errors(tmp_path):
    proc = python(tmp_path, """
import sys
import solrl
from solrl_core.errors import SolrlError
for kwargs in ({"prompts": "missing.txt"}, {"eval_prompts": "gone.txt"}):
    try:
        solrl.train(run_dir="r", **kwargs)
    except SolrlError as exc:
        print("ERROR", exc.message, "|", exc.fix)
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
""")
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "ERROR prompt file missing.txt does not exist | check the path given to prompts=", (proc.stdout
            + proc.stderr)
    assert lines[1] == "ERROR prompt file gone.txt does not exist | check the path given to eval_prompts=", lines
    assert lines[2] == "NO-TORCH" and not (tmp_path / "r").exists()
    assert "--" not in proc.stdout  # no command-line flag named to a Python caller
