"""The TUI on an 80x24 terminal: a compact header, panels that scroll, a help screen, an evaluation
chart with error bars on an honest y range, and the training process's CPU and memory use."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time


from solrl_cli.tui.app import JsonlTail, SolrlMonitor
from solrl_cli.tui.meter import ProcessMeter
from solrl_cli.tui.panels import eval_charts
from solrl_cli.tui.screens import HelpScreen
from solrl_cli.tui.state import PANELS, RunState
from solrl_core import events as ev
from tests.screens import iteration, SMALL, started, text_of

KINDS = {"tinyworld_geneval.strict_accuracy": 0.4751, "tinyworld_geneval.count": 0.8423,
         "tinyworld_geneval.position": 0.5741}


def eval_log(path, evals: int = 6, change: float = 0.01, se: float = 0.02) -> None:
    """A run with a base evaluation and `evals` later ones, each `change` above the last, +- `se`."""
    log = ev.JsonlLog(path)
    log(started(str(path.parent)))
    log(ev.EvalFinished(iteration=0, weights="base", prompts="tinyworld_heldout_all", samples=1952, mean=0.6931,
                        components={}, extras=KINDS, seconds=23.4))
    for i in range(1, 5 * evals + 1):
        log(iteration(i))
        if i % 5 == 0:
            k = i // 5
            log(ev.EvalFinished(iteration=i, weights="ema", prompts="tinyworld_heldout_all", samples=1952,
                                mean=0.6931 + change * k, components={},
                                extras={key: v + 0.001 * k for key, v in KINDS.items()},
                                seconds=22.1, delta_se={"mean": se, "tinyworld_geneval.count": 0.0171}))
    log.close()


def run(app: SolrlMonitor, steps) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        async with app.run_test(size=SMALL) as pilot:
            await pilot.pause(0.3)
            await steps(pilot)
    asyncio.run(scenario())


def test_header_is_compact_and_the_eval_panel_scrolls_to_every_row(tmp_path):
    eval_log(tmp_path / "events.jsonl")
    app = SolrlMonitor(JsonlTail(tmp_path / "events.jsonl"))
    seen: dict[str, str] = {}

    async def steps(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("4")
        await pilot.pause(0.2)
        seen["top"] = text_of(app)
        await pilot.press("end")
        await pilot.pause(0.2)
        seen["end"] = text_of(app)

    run(app, steps)
    lines = seen["top"].splitlines()
    tabs = next(i for i, line in enumerate(lines) if "1 time" in line and "6 environment" in line)
    assert tabs <= 3  # run, progress, flags: the rest of the screen is the panel's
    assert "held-out evaluation" in seen["top"]
    end = seen["end"]
    assert "…" not in "".join(end.splitlines()[tabs + 1:-1])  # no cell of the tables cut
    rows = [line.split() for line in end.splitlines()]
    for k in range(1, 7):  # every evaluation, scrolled to, its numbers whole
        assert [str(5 * k), "ema", f"{0.6931 + 0.01 * k:.4g}", f"{0.01 * k:+.4f}", "0.0200", "22.1"] in rows
    assert ["count", "0.842", "0.848", "+0.006", "0.017"] in rows  # per kind, base against the latest, with its s.e.


def test_question_mark_lists_every_key_and_escape_closes_it(tmp_path):
    eval_log(tmp_path / "events.jsonl", evals=1)
    app = SolrlMonitor(JsonlTail(tmp_path / "events.jsonl"))
    seen: dict[str, object] = {}

    async def steps(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        seen["screen"], seen["text"] = app.screen, text_of(app)
        await pilot.press("escape")
        await pilot.pause(0.1)
        seen["after"] = app.screen

    run(app, steps)
    assert isinstance(seen["screen"], HelpScreen) and not isinstance(seen["after"], HelpScreen)
    text = str(seen["text"])
    for i, label in enumerate(PANELS.values(), 1):
        assert re.search(rf"\b{i}\s+{re.escape(label)}", text)
    for key in ("tab", "up/down", "pgup/pgdn", "p ", "q ", "escape"):
        assert key in text


def test_eval_chart_draws_error_bars_and_a_range_that_holds_them(tmp_path):
    state = RunState()
    for e in (ev.EvalFinished(iteration=0, weights="base", prompts="p", samples=64, mean=0.50, components={}, extras={},
                              seconds=1.0),
              ev.EvalFinished(iteration=10, weights="ema", prompts="p", samples=64, mean=0.51, components={}, extras={},
                              seconds=1.0, delta_se={"mean": 0.02})):
        state.apply(e)
    (spec,) = eval_charts(state)
    (label,) = spec.lines
    assert spec.errors[label] == [0.0, 0.02]
    lo, hi = spec.ylim
    assert lo <= 0.49 and hi >= 0.53  # 0.51 +- 0.02 inside the frame, so +0.01 reads as within the error

    # no error: the range still spans 10% of the values
    eval_log(tmp_path / "events.jsonl", evals=2, change=0.001, se=0.0)
    app = SolrlMonitor(JsonlTail(tmp_path / "events.jsonl"))
    seen: dict[str, str] = {}

    async def steps(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("4")
        await pilot.pause(0.2)
        seen["text"] = text_of(app)

    run(app, steps)
    ticks = [float(line.split("┤")[0]) for line in seen["text"].splitlines() if "┤" in line]
    assert max(ticks) - min(ticks) >= 0.1 * 0.6951 * 0.9  # a 0.002 rise is not drawn across the whole height

    eval_log(tmp_path / "bars.jsonl", evals=2)
    app = SolrlMonitor(JsonlTail(tmp_path / "bars.jsonl"))
    run(app, steps)
    chart = [line for line in seen["text"].splitlines() if "┤" in line or line.lstrip().startswith("│")]
    # capped bars
    assert sum(line.count("─") for line in chart) >= 4 and any("│" in line.split("┤")[-1][:-2] for line in chart)


def test_process_meter_measures_cpu_and_resident_memory():
    meter = ProcessMeter(os.getpid())
    assert meter.read()[0] is None  # one reading: no interval yet
    wall, cpu = time.monotonic(), time.process_time()
    while time.process_time() < cpu + 0.5:  # busy on one core (as much of it as a shared machine gives)
        pass
    expected = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)
    percent, rss = meter.read()
    assert percent is not None and abs(percent - expected) < 0.1 * expected + 5, (percent, expected)
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    assert abs(rss - int(status["VmRSS"].split()[0]) * 1024) < 64 << 20


def test_header_shows_the_run_process_cpu_and_rss_when_monitoring_it(tmp_path):
    eval_log(tmp_path / "events.jsonl", evals=1)
    (tmp_path
     / "solrl.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "now"}))
    app = SolrlMonitor(JsonlTail(tmp_path / "events.jsonl"))
    seen: dict[str, str] = {}

    async def steps(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.pause(2.3)  # a second reading: a CPU share over an interval
        seen["text"] = text_of(app)

    run(app, steps)
    header = seen["text"].splitlines()[2]
    assert re.search(r"CPU \d+% of \d+ cores  RSS \d+\.\d\d GiB", header), header
    assert app.meter.pid == os.getpid()
