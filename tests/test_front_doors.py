"""One train start checks once: the plan resolved once (for the real world size), each prompt file
read once, the config validated once, however many layers (the front door, the doctor's preflight,
the session) look at them. Counted over one `start_run` of the tiny preset through its first
iteration. Before this was so (main at e469632) the same start resolved the plan 3 times, read
prompt files 6 times and validated the config twice."""

from __future__ import annotations

import sys
from collections import Counter

from solrl_core import events
from solrl_core.config.schema import Config
from solrl_core.data import prompts as prompt_data
from solrl_core.plan import resolve as plan_resolve
from solrl_core.tools.start import RunRequest, start_run


def _count(monkeypatch, counts: Counter, owner, name: str, key: str) -> None:
    """Wrap owner.name so each call adds to counts[key], wherever a module imported it by name."""
    original = getattr(owner, name)

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts[key] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    if owner is not Config:
        for module in list(sys.modules.values()):
            if module is not owner and getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counted)


def test_a_train_start_resolves_reads_and_validates_once(monkeypatch, fast_sets):
    import solrl_core.loop.session  # noqa: F401 - imported before counting, so its names are wrapped too
    import solrl_core.doctor  # noqa: F401

    counts: Counter = Counter()
    _count(monkeypatch, counts, plan_resolve, "resolve_plan", "plan")
    _count(monkeypatch, counts, prompt_data, "load_prompts", "prompts")
    _count(monkeypatch, counts, Config, "validate", "validate")
    start = start_run(RunRequest(sets=tuple(fast_sets("run.iterations=1"))))
    session = start.train(events.EventBus())
    assert session.state.iteration == 1
    assert counts["plan"] == 1 and counts["prompts"] <= 2 and counts["validate"] == 1, dict(counts)


def test_the_parting_note_reads_the_plan_not_the_raw_config():
    """explore.precision=auto below compute capability 8.9 explores at bf16: nothing is quantized, so
    several processes part by nothing but float rounding and the note of quantized drift is not said;
    where the plan explores at a quantized precision the note names that precision, not 'auto'."""
    from solrl_core.config.presets import resolve_config
    from solrl_core.plan.plan import plan_stages
    from solrl_core.tools.start import parting_note

    cfg = resolve_config("tiny", "sol_rl")
    assert cfg.explore.precision == "auto"
    assert parting_note(plan_stages(cfg, "bf16", "bf16")) is None
    note = parting_note(plan_stages(cfg, "bf16", "nvfp4-emulated"))
    assert note is not None and "explore copy at nvfp4-emulated" in note


DOORS = {  # command line -> (the core module, its one function)
    ("eval",): ("solrl_core.tools.evaluate", "eval_request"),
    ("infer", "--prompt", "a red circle"): ("solrl_core.tools.inference", "infer_request"),
    ("explore",): ("solrl_core.tools.explore", "explore_request"),
    ("rank-check",): ("solrl_core.tools.rank_check", "rank_check_request"),
    ("export", "somewhere"): ("solrl_core.tools.export_request", "export_request"),
}


def _refusing(monkeypatch, module: str, name: str) -> list:
    """Replace the core function by one that records its call and refuses with a SolrlError."""
    import importlib

    from solrl_core.errors import SolrlError

    called: list = []

    def door(*args, **kwargs):  # type: ignore[no-untyped-def]
        called.append((args, kwargs))
        raise SolrlError("refused at the door", "nothing to fix")

    monkeypatch.setattr(importlib.import_module(module), name, door)
    return called


def test_each_command_comes_in_by_its_core_function(monkeypatch, tmp_path):
    """`solrl eval/infer/explore/rank-check/export` each call their one function in solrl_core/tools/
    and only render its answer: a refusal there is the command's one-line error and exit code."""
    from typer.testing import CliRunner

    from solrl_cli.app import app

    monkeypatch.chdir(tmp_path)
    for args, (module, name) in DOORS.items():
        called = _refusing(monkeypatch, module, name)
        done = CliRunner().invoke(app, list(args))
        assert len(called) == 1 and done.exit_code != 0 and "refused at the door" in done.output, (args, done.output)


def test_the_api_comes_in_by_the_same_functions(monkeypatch):
    """`solrl.evaluate` and `solrl.infer` call the functions `solrl eval` and `solrl infer` call."""
    import pytest

    import solrl
    from solrl_core.errors import SolrlError

    for call, (module, name) in ((lambda: solrl.evaluate(quiet=True), DOORS[("eval",)]),
                                 (lambda: solrl.infer(prompt="a red circle", quiet=True),
                                  DOORS[("infer", "--prompt", "a red circle")])):
        called = _refusing(monkeypatch, module, name)
        with pytest.raises(SolrlError, match="refused at the door"):
            call()
        assert len(called) == 1


def test_the_api_stands_beside_the_cli_not_on_it():
    """solrl/ imports nothing of solrl_cli, nor solrl_cli anything of solrl: siblings over solrl_core, both printing
    through solrl_view (the same lines as `solrl train`)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def taken(package: str, prefix: str) -> set[str]:
        out = set()
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                out |= {n for n in names if n == prefix or n.startswith(prefix + ".")}
        return out

    assert taken("solrl", "solrl_cli") == set() and taken("solrl_cli", "solrl") == set()
    assert "solrl_view.display" in taken("solrl", "solrl_view")
    assert "solrl_view.display" in taken("solrl_cli", "solrl_view")
