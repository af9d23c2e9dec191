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
