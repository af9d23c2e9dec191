"""Live MFU: a run announces its model FLOPs and the device's peaks once (telemetry/model_flops.py), and the
terminal, the TUI state and `solrl monitor`'s replay turn each iteration's phase seconds into the
MFU `solrl bench` prints (telemetry/mfu.py). The MFU arithmetic is checked on exact numbers, the count
against the analytic SANA count, the display on a real tiny run."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from solrl_view.display import TerminalDisplay
from solrl_cli.tui.panels import time_view
from solrl_cli.tui.state import JsonlTail, RunState
from solrl_view.words import mfu_text
from solrl_core import events as ev
from solrl_core.bench.flops import sana_forward_flops
from solrl_core.telemetry.mfu import phase_mfu
from solrl_core.telemetry.model_flops import SampleFlops, model_flops, phase_flops

pytest.importorskip("diffusers")


def _flops(**kw) -> ev.ModelFlops:
    base = dict(forward=1.0, train_pair=3.0, phases={"explore": 4e12, "regenerate": 1e12, "train": 4e12, "total": 9e12},
                precisions={"explore": "fp8", "regenerate": "bf16", "train": "bf16"}, peaks={"fp8": 4e12, "bf16": 2e12},
                peak_sources={"fp8": "test", "bf16": "test"}, devices=1, device="cuda:0 (made-up)")
    return ev.ModelFlops(**{**base, **kw})


SECONDS = {"explore": 2.0, "selection": 0.0, "regenerate": 1.0, "reward": 0.5, "train": 4.0, "sync": 0.5, "total": 8.0}


def test_mfu_is_phase_flops_over_seconds_over_the_peak_of_its_precision():
    mfu = phase_mfu(_flops(), SECONDS)
    assert mfu == {"explore": 0.5, "regenerate": 0.5, "train": 0.5, "total": (1.0 + 0.5 + 2.0) / 8.0}
    assert phase_mfu(_flops(devices=2), SECONDS)["train"] == 0.25  # the FLOPs of two processes on two devices
    unmeasured = phase_mfu(_flops(peaks={"bf16": 2e12}), SECONDS)  # no fp8 figure on this device
    assert unmeasured["explore"] is None and unmeasured["total"] is None and unmeasured["train"] == 0.5
    no_regen = phase_mfu(_flops(phases={"explore": 4e12, "regenerate": 0.0, "train": 4e12}), SECONDS)
    assert "regenerate" not in no_regen
    assert mfu_text(_flops(peaks={"bf16": 2e12}),
                    SECONDS) == "  MFU unmeasured (explore unmeasured, regenerate 50.0%, train 50.0%)"
    assert mfu_text(_flops(forward=None, note="x"), SECONDS) == "" and mfu_text(None, SECONDS) == ""


def test_a_live_mfu_never_tops_100_percent_against_a_measured_peak():
    """The CPU's peak is a short GEMM measured once at the start: a phase may run faster than it did."""
    fast = {**SECONDS, "train": 1.0}  # 4 TFLOP/s of bf16 work against a measured 2
    mfu = phase_mfu(_flops(peak_sources={"fp8": "datasheet: x", "bf16": "measured: 1024x1024 bf16 GEMM"}), fast)
    assert mfu["train"] == 1.0 and mfu["regenerate"] == 0.25 and mfu["explore"] == 0.5  # lifted to train's own rate


def test_a_model_the_meta_device_cannot_run_gets_no_mfu_and_says_why():
    run = SimpleNamespace(device=torch.device("cpu"), world_size=1, prompts=["a"], dtype=torch.float32,
                          conditioning=lambda prompts: None,
                          model=SimpleNamespace(transformer=torch.nn.Linear(2, 2)))
    flops = model_flops(run)
    assert flops.forward is None and "the meta-device count failed" in flops.note
    state = RunState()
    state.apply(flops)
    assert state.log[-1].endswith("no MFU for this run") and state.mfu() == {}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One iteration of the tiny sol_rl run, its events as the terminal printed them and as logged."""
    from solrl_core.config.presets import resolve_config
    from solrl_core.loop.trainer import train
    from tests.conftest import FAST

    run_dir = tmp_path_factory.mktemp("mfu") / "run"
    cfg = resolve_config("tiny", "sol_rl",
                         sets=[*FAST, f"run.run_dir={run_dir}", "run.iterations=1", "run.eval_prompts=",
                                                    # two threads on a busy 2-core machine spin for seconds
                                                    "run.threads=1"])
    console = Console(file=io.StringIO(), width=400, highlight=False, markup=False)
    seen: list[ev.Event] = []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    bus.subscribe(TerminalDisplay(console, verbose=True))  # the phases' MFU: train --verbose
    session = train(cfg, bus)
    return session, seen, console.file.getvalue(), run_dir


def test_a_run_counts_its_flops_once_as_the_bench_does(tiny_run):
    session, seen, _, _ = tiny_run
    kinds = [type(e) for e in seen]
    assert kinds.count(ev.ModelFlops) == 1 and kinds.index(ev.ModelFlops) == kinds.index(ev.RunStarted) + 1
    flops = next(e for e in seen if isinstance(e, ev.ModelFlops))
    run = session.run
    side, tokens = run.engine.model.latent_shape[-1], run.engine.conditioning(run.prompts[:1]).embeds.shape[1]
    # exact, independent
    assert flops.forward == sana_forward_flops(dict(run.engine.model.transformer.config), side, tokens)
    cfg = run.config
    per = SampleFlops(flops.forward, flops.train_pair - flops.forward * (2 if cfg.algorithm.kl_beta else 1))
    assert flops.phases == phase_flops(run.plan, cfg, per, cfg.run.prompts_per_iteration)
    assert flops.precisions == {"explore": "fp32", "regenerate": "fp32", "train": "fp32"}  # nvfp4-emulated: fp32 GEMMs
    assert flops.peaks["fp32"] > 0 and flops.peak_sources["fp32"].startswith("measured: 1024x1024 fp32 GEMM")


def test_the_terminal_prints_each_iterations_mfu(tiny_run):
    _, seen, printed, _ = tiny_run
    it = next(e for e in seen if isinstance(e, ev.IterationFinished))
    flops = next(e for e in seen if isinstance(e, ev.ModelFlops))
    mfu = phase_mfu(flops, it.seconds)
    assert set(mfu) == {"explore", "regenerate", "train", "total"} and all(v > 0 for v in mfu.values())
    assert f"MFU {100 * mfu['total']:.1f}% (explore {100 * mfu['explore']:.1f}%" in printed
    assert "model FLOPs (FlopCounterMode, meta device):" in printed and "peak fp32:" in printed


def test_the_monitor_replays_the_same_mfu_from_the_log(tiny_run):
    """`solrl monitor` reads events.jsonl: its state gives the figure the live run printed."""
    from solrl_cli.tui.app import SolrlMonitor
    from tests.screens import screen_text, SIZE

    _, seen, printed, run_dir = tiny_run
    state = RunState()
    for e in JsonlTail(run_dir / "events.jsonl").poll():
        state.apply(e)
    live = next(e for e in seen if isinstance(e, ev.ModelFlops))
    assert dataclasses.replace(state.flops, time=live.time) == live
    total = f"{100 * state.mfu()['total']:.1f}%"
    assert f"MFU {total}" in printed
    table = Console(file=io.StringIO(), width=200, record=True)
    table.print(time_view(state))
    text = table.export_text()
    assert "MFU last" in text and f"{100 * state.mfu()['train']:.1f}% fp32" in text

    async def scenario() -> None:
        app = SolrlMonitor(JsonlTail(run_dir / "events.jsonl"))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.3)
            assert f"MFU {total}" in screen_text(app)  # the status line

    asyncio.run(scenario())
