"""Long waits say what they wait for (issue 25: 12, 15, 16, 17): the hub probe of `solrl doctor`, the
progress of evaluations and compile warm-ups, `--tui` without a terminal, and labelled image grids."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m solrl_cli ARGS` with stdout a pipe, as under nohup, CI or `| tee`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "solrl_cli", *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


# --- 16: --tui without a terminal ------------------------------------------------------------------

def test_tui_without_a_terminal_falls_back_to_the_plain_display_and_exits(fast_sets):
    sets = [a for s in fast_sets("run.iterations=1", "run.eval_prompts=") for a in ("--set", s)]
    result = _cli("train", "--tui", *sets, timeout=300)  # a hung Textual app would never return
    assert result.returncode == 0, result.stdout
    assert "\x1b[" not in result.stdout
    assert "--tui needs a terminal" in result.stdout
    assert "done: 1 iteration in" in result.stdout


# --- 12: the doctor asks the hub when weights must be downloaded ------------------------------------

def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_doctor_fails_fast_when_the_hub_cannot_be_reached_and_weights_are_missing(tmp_path, monkeypatch):
    import time

    from solrl_core.config.presets import resolve_config
    from solrl_core.doctor import failed_for_run, run_checks

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))  # nothing cached: the weights must be downloaded
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.perf_counter()
    checks = run_checks(resolve_config("sana", "sol_rl", "imagereward"))
    failed = {c.name: c for c in failed_for_run(checks)}
    assert "hub reachable" in failed, [c.name for c in checks]
    assert "cannot reach http://127.0.0.1:" in failed["hub reachable"].detail
    assert "HF_ENDPOINT" in failed["hub reachable"].fix and "--model-path" in failed["hub reachable"].fix
    assert time.perf_counter() - t0 < 60  # a refused connection answers at once; the probe's own limit is 3 s


def test_the_hub_probe_passes_on_any_http_answer_and_is_skipped_with_nothing_to_download(monkeypatch):
    import dataclasses
    import http.server
    import threading

    from solrl_core.doctor.check import machine
    from solrl_core.doctor.weights import hub_reachable

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 - the handler's protocol
            self.send_response(404)  # any answer: the hub is there
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        m = dataclasses.replace(machine(), offline=False)
        assert hub_reachable(m, 12.0).status == "pass"
        assert hub_reachable(m, 0.0) is None  # everything local: no probe
        assert hub_reachable(dataclasses.replace(m, offline=True), 12.0) is None
    finally:
        server.shutdown()


# --- 15: evaluations say they have begun --------------------------------------------------------------

def test_each_evaluation_is_announced_before_it_runs_in_every_view(fast_sets):
    import io

    from rich.console import Console

    from solrl_view.display import TerminalDisplay
    from solrl_cli.tui.state import RunState
    from solrl_core import events as ev
    from solrl_core.config.presets import resolve_config
    from solrl_core.loop.trainer import StopFlag, train

    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    sets = fast_sets("run.iterations=1", "run.eval_prompts=tinyworld_heldout", "run.eval_seeds=1")
    train(resolve_config("tiny", "sol_rl", sets=sets), bus, stop=StopFlag())
    evals = [(type(e).__name__, e.weights) for e in seen if isinstance(e, (ev.EvalStarted, ev.EvalFinished))]
    assert evals == [("EvalStarted", "base"), ("EvalFinished", "base"), ("EvalStarted", "ema"), ("EvalFinished", "ema")]
    started = next(e for e in seen if isinstance(e, ev.EvalStarted))
    assert started.samples == next(e for e in seen if isinstance(e, ev.EvalFinished)).samples
    console = Console(file=io.StringIO(), width=200)
    view, state = TerminalDisplay(console), RunState()
    for e in seen:
        view(e)
        state.apply(e)
    text = console.file.getvalue()
    assert f"evaluating the base weights on tinyworld_heldout ({started.samples} images) ..." in text
    labels = [view.progress.tasks[view.task].description]  # after the run: the last evaluation has ended
    assert labels == [view.label] and view.label.startswith("reward "), labels
    assert any("evaluating the ema weights on tinyworld_heldout" in line for line in state.log)


# --- 17: grids say what each image is ----------------------------------------------------------------

def test_grids_carry_prompt_seed_and_reward_labels():
    import numpy as np
    import torch

    from solrl_core.io.images import grid_rows, make_grid

    columns = {"best 1": torch.full((2, 3, 32, 32), 0.5), "worst 1": torch.full((2, 3, 32, 32), 0.5)}
    rows = grid_rows(["a red cube", "two blue spheres"], [7, 8])
    assert rows == ["a red cube / seed 7", "two blue spheres / seed 8"]
    bare = make_grid(columns)
    labelled = make_grid(columns, rows=rows, captions={"best 1": ["0.91", "0.88"], "worst 1": ["0.12", "0.05"]})
    assert labelled.width > bare.width and labelled.height > bare.height  # a label column, a caption line a row
    pixels = np.asarray(labelled)
    label_strip = pixels[:, : labelled.width - bare.width]
    assert (label_strip < 128).any()  # the row labels are drawn, not an empty margin
    top = bare.height - 2 * (128 + 4) - 4  # the header, as in the bare grid
    first_caption = pixels[top + 4 + 128: top + 4 + 128 + 16, labelled.width - bare.width:]
    assert (first_caption < 128).any()  # a reward under the first image of each column


@pytest.mark.slow
def test_compiling_on_a_cpu_leaks_no_cuda_home_warning(tmp_path):
    code = ("import torch\nfrom solrl_core.engine.regions import CompiledBlocks\n"
            "m = CompiledBlocks(torch.nn.Linear(4, 4))\nm(torch.randn(2, 4, requires_grad=True)).sum().backward()\n"
            "print('ran')\n")  # the backward compile imports cpp_extension
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_HOME": "/usr/local", "CUDA_VISIBLE_DEVICES": "",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-2000:]
    assert "No CUDA runtime is found" not in done.stderr, done.stderr[-2000:]
