"""`solrl bench`: how fast each family trains on this machine, on a random-weight model of the preset's
published size (no download): seconds, throughput, peak memory and MFU per phase, ratios against the
compiled baseline. With --explore, one denoising step per explore backend instead. One core function
does the work (solrl_core/bench/run.py, or bench/explore.py); this renders it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from solrl_cli import options as opt
from solrl_cli.common import console
from solrl_cli.errors import user_errors
from solrl_cli.tables import Column, print_fitted

Model = Annotated[Optional[str], typer.Option("--model", "-m", help="Model preset: sana, flux1, sd3 or a Wan video "
                                                                    "preset (wan21_t2v_1_3b, wan21_t2v_14b, "
                                                                    "wan22_ti2v_5b); at --size tiny, any of their "
                                                                    "architectures. Default: sana.")]
Families = Annotated[Optional[list[str]], typer.Option("--family", "-f", help="A family to time (repeatable). Default: "
                                                                              "sol_rl, compile, naive_scaling.")]
Size = Annotated[str, typer.Option("--size", help="real: the preset's published transformer size (a GPU); tiny: the "
                                                  "same architecture, tiny widths (any machine).")]
N = Annotated[Optional[int],
              typer.Option("--n", min=2, help="Seeds explored per prompt. Default: 96 (real), 8 (tiny).")]
K = Annotated[Optional[int], typer.Option("--k", min=2, help="Seeds kept and trained per prompt. Default: 24 (real), 4 "
                                                             "(tiny).")]
MicroBatch = Annotated[Optional[int], typer.Option("--micro-batch", min=1, help="Update micro-batch. Default: the "
                                                                                "model preset's.")]
RolloutBatch = Annotated[Optional[int], typer.Option("--rollout-batch", min=1, help="Samples per rollout forward. "
                                                                                    "Default: 24 (real), 8 (tiny).")]
Iterations = Annotated[Optional[int], typer.Option("--iterations", min=2, help="Iterations per family, warm-up "
                                                                               "included (default 6: each figure is "
                                                                               "the median of the other 5, with their "
                                                                               "spread); with --explore, calls per "
                                                                               "backend (default 13).")]
Warmup = Annotated[Optional[int], typer.Option("--warmup", min=0, help="First iterations (--explore: calls) left out "
                                                                       "of the figures. Default 1 (--explore: 3).")]
JsonOut = Annotated[Optional[Path], typer.Option("--json", help="Write every figure to this JSON file.")]
Explore = Annotated[bool, typer.Option("--explore", help="Time one denoising step per explore backend (bf16, fp8, "
                                                         "fp8-e5m2-tensor, nvfp4-emulated), its error against bf16 and "
                                                         "the refresh, instead of the families.")]
Backends = Annotated[Optional[list[str]], typer.Option("--backend", help="--explore: a backend to time (repeatable; "
                                                                         "fp8-torchao, nvfp4, fp8-e5m2-delayed and "
                                                                         "fp8+fp8-attention too). Default: bf16, fp8, "
                                                                         "fp8-e5m2-tensor, nvfp4-emulated.")]
Compile = Annotated[bool, typer.Option("--compile/--no-compile", help="--explore: also time each backend "
                                                                      "torch.compile'd block by block.")]
NumericsOnly = Annotated[bool, typer.Option("--numerics-only", help="--explore on a CPU: run fp8 through torch's CPU "
                                                                    "reference kernel (exact numerics, no speed-up) "
                                                                    "instead of skipping it.")]
CompileModes = Annotated[Optional[list[str]], typer.Option("--compile-mode", help="torch.compile mode of the compiled "
                                                                                  "copies (run.compile_mode; "
                                                                                  "repeatable: each mode timed in "
                                                                                  "turn, e.g. --compile-mode default "
                                                                                  "--compile-mode "
                                                                                  "max-autotune-no-cudagraphs). "
                                                                                  "Default: the config's, "
                                                                                  "max-autotune-no-cudagraphs.")]
SkipMemoryCheck = Annotated[bool, typer.Option("--skip-memory-check", help="--size real: build even when the doctor's "
                                                                           "(approximate) memory estimate says a "
                                                                           "family does not fit.")]
AutoExplore = Annotated[bool, typer.Option("--auto-explore", help="sol_rl: after its iterations, the calibration "
                                                                  "explore.calibrate=steps+precision would make "
                                                                  "(precision x preview steps, recall and measured "
                                                                  "seconds) and the iteration time derived at its "
                                                                  "choice from the measured phases.")]
RealVae = Annotated[bool, typer.Option("--real-vae", help="Decode through the published VAE architecture (random "
                                                          "weights, flux1 and sd3; not recorded for sana and Wan) at "
                                                          "the preset's resolution instead of a two-block VAE: "
                                                          "decoding costs what it does in a real run.")]
RewardModel = Annotated[str, typer.Option("--reward-model", help="jpeg: a cheap reward on the CPU; pickscore: a "
                                                                 "random-weight CLIP ViT-H/14 (PickScore_v1's size) "
                                                                 "scoring on the device, as a real reward would.")]
PHASE_ROWS = ("explore", "regenerate", "reward", "train", "sync", "total")
MODEL_PHASES = ("explore", "regenerate", "train")


def bench(
    model: Model = None, family: Families = None, size: Size = "real", device: opt.Device = None, n: N = None,
    k: K = None, micro_batch: MicroBatch = None, rollout_batch: RolloutBatch = None, iterations: Iterations = None,
    warmup: Warmup = None, set_: opt.Sets = None, json_out: JsonOut = None, explore: Explore = False,
    backend: Backends = None, compile_: Compile = True, numerics_only: NumericsOnly = False,
    skip_memory_check: SkipMemoryCheck = False, compile_mode: CompileModes = None, auto_explore: AutoExplore = False,
    real_vae: RealVae = False, reward_model: RewardModel = "jpeg",
) -> None:
    """Time Sol-RL against its baselines on this machine before any download: random weights at the published size."""
    from transformers.utils import logging as hf_logging

    from solrl_core import events as ev
    from solrl_core.bench.explore import explore_options, run_explore
    from solrl_core.bench.run import FAMILIES, BenchOptions, run_bench

    hf_logging.disable_progress_bar()  # its save and load bars would interleave with the bench's own lines
    with user_errors():
        bus = ev.EventBus()
        if explore:
            options = explore_options(model=model, size=size, device=device, n=n, batch=rollout_batch, calls=iterations,
                                      warmup=warmup, backends=backend, compile=compile_, numerics_only=numerics_only,
                                      unused={"--family": family, "--k": k, "--micro-batch": micro_batch, "--set": set_,
                                              "--compile-mode": compile_mode, "--auto-explore": auto_explore or None,
                                              "--real-vae": real_vae or None,
                                              "--reward-model": None if reward_model == "jpeg" else reward_model})
            with console.status("solrl bench --explore: starting") as status:
                bus.subscribe(lambda e: _progress(e, status))
                result = run_explore(options, bus)
            _explore_report(result.to_dict())
        else:
            results = []
            for mode in compile_mode or [None]:  # each mode a bench of its own, one after the other
                mode_set = () if mode is None else (f"run.compile_mode={mode}",)
                options = BenchOptions(model=model or "sana", families=tuple(family or FAMILIES), size=size,
                                       device=device or "auto",
                                       n=n, k=k, micro_batch=micro_batch, rollout_batch=rollout_batch,
                                       iterations=iterations or BenchOptions.iterations,
                                       warmup=1 if warmup is None else warmup, sets=(*(set_ or ()), *mode_set),
                                       check_memory=not skip_memory_check, auto_explore=auto_explore, real_vae=real_vae,
                                       reward_model=reward_model)
                with console.status(f"solrl bench: starting{f' (compile mode {mode})' if mode else ''}") as status:
                    bus = ev.EventBus()
                    bus.subscribe(lambda e: _progress(e, status))
                    # the JSON after each family: a run cut off later still leaves what it measured
                    done = list(results)
                    result = run_bench(options, bus,
                            on_family=(lambda r: _write_json(json_out, [*done, r.to_dict()])) if json_out else None)
                if mode is not None:
                    console.print(f"\n[bold]compile mode {mode}[/bold] (the compiled explore and rollout copies)")
                _report(result.to_dict())
                results.append(result.to_dict())
        if json_out:
            _write_json(json_out, results if not explore else [result.to_dict()])
            console.print(f"json: {json_out}")


def _write_json(path: Path, results: list[dict[str, Any]]) -> None:
    """One result as itself, several (one a compile mode) as a list; written whole or not at all."""
    from solrl_core.io.atomic import write_atomic

    write_atomic(path, json.dumps(results[0] if len(results) == 1 else results, indent=2))


def _progress(event: Any, status: Any) -> None:
    """One line per step (building, compiling, each iteration), the current one beside the spinner."""
    from solrl_core import events as ev

    if isinstance(event, ev.BenchProgress):
        line = ("warning: " if event.stage == "warning" else "") + event.message
    elif isinstance(event, ev.CompileStarted):
        line = f"  compiling the {event.target} (torch.compile: seconds on a tiny model, minutes at real size)"
    elif isinstance(event, ev.CompileFinished):
        line = f"  compiled the {event.target} in {event.seconds:.1f} s"
    elif isinstance(event, ev.IterationFinished):
        line = f"  iteration {event.iteration}/{event.iterations}: {event.seconds['total']:.2f} s"
    elif isinstance(event, ev.OutOfMemoryBackoff):
        line = f"  out of memory in the {event.phase}: {event.setting} {event.old} -> {event.new}, iteration redone"
    elif isinstance(event, ev.RunWarning):
        line = f"  warning: {event.message}"
    else:
        return
    console.print(line)
    status.update("solrl bench: " + line.strip())


def _report(result: dict[str, Any]) -> None:
    from solrl_core.telemetry.mfu import format_flops

    m, o, rows, where = result["model"], result["options"], result["rows"], result["device"]
    console.print(f"\n{m['preset']} at {m['size']} size ({_count(m['parameters'])} parameters, random weights), "
                  f"N={o['n']} K={o['k']}, one prompt group; median of {rows[0]['iterations_measured']} iteration(s) "
                  f"after {o['warmup']} warm-up, the spread (fastest-slowest) under it; on {where}")
    for r in rows:  # what the auto switches chose per family, TF32 included on CUDA (plan.MachinePlan.describe)
        if r.get("machine"):
            console.print(f"  {r['family']}: {r['machine']}", highlight=False)
    real = any(r["estimate_gib"] is not None for r in rows)  # the doctor's estimate is of the real model
    seconds = _table("seconds per iteration", ("family", "explore", "regen", "reward", "train", "sync", "total", "peak "
                                                                                                                 "GiB",
                                                *(("doctor est",) if real else ())))
    for r in rows:
        est = r["estimate_gib"]
        seconds.add_row(r["family"], *(_with_spread(r, p) for p in PHASE_ROWS), f"{r['peak_gib']['total']:.2f}",
                        *((f"{est:.1f}" if est is not None else "-",) if real else ()))
    seconds.print()
    unit = "clips" if m.get("frames") else "images"  # a video model trains clips
    rates = _table("throughput", ("family", "explore steps/s", "regen steps/s", "train pairs/s", f"{unit}/s"))
    for r in rows:
        rates.add_row(r["family"],
                      *(f"{v:.3g}" if v else "-" for v in (r["rates"].get(p) for p in MODEL_PHASES + ("total",))))
    rates.print()
    flops = _table("model FLOP per iteration", ("family", "explore", "regen", "train", "total"))
    mfu = _table("model FLOPs utilisation (MFU), at the precision the phase ran", ("family", "explore", "regen",
                                                                                   "train", "total"))
    for r in rows:
        flops.add_row(r["family"], *(format_flops(r["flops"][p]) for p in MODEL_PHASES + ("total",)))
        mfu.add_row(r["family"], *(f"{_percent(r['mfu'].get(p))} {r['precision'][p]}" if r["flops"][p] else "-"
                                   for p in MODEL_PHASES), _percent(r["mfu"].get("total")))
    flops.print()
    mfu.print()
    console.print(f"steps/s: one sample through one denoising step; pairs/s: (sample, timestep) pairs of the update; "
                  f"{unit}/s: trained {unit} per iteration second. peak GiB: {rows[0]['memory_source']}. MFU: model "
                  f"FLOPs / "
                  "seconds / the device's dense peak at the phase's precision; total: the time its work takes at peak "
                  "/ its time.")
    peaks = {(p["precision"], p["tflops"], p["source"]) for r in rows for p in r["peak_flops"].values() if p}
    for precision, tflops, source in sorted(peaks):
        console.print(f"peak {precision}: {tflops:.4g} TFLOP/s ({source}) on {where}")
    if m["size"] != "real":
        console.print("peak GiB beside the doctor's estimate at --size real only (its estimate is of the preset's real "
                      "model)")
    for r in rows:
        _family_notes(r)
    if not any(r["family"] == "compile" for r in rows):
        console.print("no compile family measured: no ratio against the compiled baseline")
    for r in rows:
        if r.get("auto_explore"):
            _auto_explore_report(r)


def _auto_explore_report(r: dict[str, Any]) -> None:
    a = r["auto_explore"]
    table = _table(f"{r['family']}: preview settings against full precision and steps (calibration, "
                   f"{a['calibration_seconds']:.1f}s)",
                   ("precision@steps", "recall", "s.e.", "s"))
    for c in a["candidates"]:
        mark = (" (fixed)" if c["name"] == a["fixed"] else "") + (" <- auto" if c["name"] == a["chosen"] else "")
        table.add_row(c["name"] + mark, f"{c['recall']:.3f}", f"{c['recall_se']:.3f}", f"{c['seconds']:.2f}")
    table.print()
    d = a["derived_seconds"]
    console.print(f"explore.calibrate=steps+precision would pick {a['chosen']}: {a['why']}")
    console.print(f"a {r['family']} iteration at {a['chosen']}: about {d['total']:.2f}s (Stage 1 {d['explore']:.2f}s) "
                  f"against {r['seconds']['total']:.2f}s measured at {a['fixed']}: DERIVED, not measured (the measured "
                  f"phases, Stage 1 scaled by the table's time ratio {a['time_ratio']:.2f}; calibration not counted), "
                  f"on this random-weight model "
                  "and the bench's reward: a real model's and reward's recall can choose otherwise")


def _explore_report(result: dict[str, Any]) -> None:
    """The steps measured, as one table per model: ms, speed-up over eager bf16, error, refresh."""
    o = result["options"]
    for model in o["models"]:
        rows = [r for r in result["rows"] if r["model"] == model]
        base = next((r["seconds"] for r in rows if r["backend"] == "bf16" and r.get("compiled") is False
                     and "seconds" in r), None)
        table = _table(f"{model}: one denoising step at batch {o['batch']}, {o['size']} size, on {result['device']}",
                       ("backend", "ms/step", "speed-up", "error", "refresh ms"))
        for r in rows:
            refresh = next((f"{x['refresh_seconds'] * 1e3:.1f}" for x in rows if x["backend"] == r["backend"]
                            and "refresh_seconds" in x), "-")
            if "seconds" in r:
                table.add_row(r["backend"] + (" +compile" if r["compiled"] else ""), f"{r['seconds'] * 1e3:.2f}",
                              f"{base / r['seconds']:.2f}x" if base else "-", f"{100 * r['rel_error']:.2f}%",
                              refresh if not r["compiled"] else "")
            elif "skipped" in r:
                table.add_row(r["backend"] + (" +compile" if r.get("compiled") else ""), "not timed", "-", "-", "-")
        console.print()
        table.print()
    skipped = [f"{r['backend']}: {r['skipped']}" for r in result["rows"] if "skipped" in r]
    for line in dict.fromkeys(skipped):
        console.print(f"not timed: {line}")
    console.print("speed-up: over eager bf16. error: relative RMS of the output against the bf16 output on the same "
                  "inputs (a check of the kernels, not a quality figure). refresh: load the merged weights and "
                  "re-quantize. Random weights.")


def _with_spread(r: dict[str, Any], phase: str) -> str:
    """The median seconds, and under it the fastest-slowest of the measured iterations."""
    spread = r.get("spread", {}).get(phase)
    median = f"{r['seconds'][phase]:.2f}"
    return f"{median}\n{spread[0]:.2f}-{spread[1]:.2f}" if spread and spread[1] > spread[0] else median


def ratio_text(ratio: Optional[float], span: Optional[list[float]]) -> str:
    """'2.73x (1.90x-3.60x)', and whether that range holds 1.0x: then the iterations do not tell the two apart."""
    if not ratio:
        return "-"
    if not span:
        return f"{ratio:.2f}x"
    overlap = "; the spread overlaps 1.0x: no measured difference" if span[0] <= 1.0 <= span[1] else ""
    return f"{ratio:.2f}x (range {span[0]:.2f}x-{span[1]:.2f}x{overlap})"


def _family_notes(r: dict[str, Any]) -> None:
    notes = []
    vs = r["vs_compile"]
    if vs:
        notes.append(f"vs compile: total {ratio_text(vs['total'], vs.get('total_range'))}, rollout (explore + "
                     f"regenerate) "
                     + ratio_text(vs["rollout"], vs.get("rollout_range")))
    if r["compile_seconds"]:
        notes.append("compiled " + ", ".join(f"{t} in {s:.1f} s" for t, s in r["compile_seconds"].items()) + " (one "
                                                                                                             "time)")
    if r.get("graphs_after_warmup"):
        notes.append(f"{r['graphs_after_warmup']} graphs recompiled after warm-up (TORCH_LOGS=recompiles says why)")
    notes += [f"out-of-memory back-off {b}: the figures are at the lower setting" for b in r["backoffs"]]
    if notes:
        console.print(f"{r['family']}: " + "; ".join(notes))


class _Rows:
    """A table's title, columns and rows, printed by tables.print_fitted: every cell whole at any width
    (a pipe is 80 columns), the numbers split over several tables, each repeating the first column, rather than cut."""

    def __init__(self, title: str, columns: tuple[str, ...]) -> None:
        self.title, self.rows = title, []
        self.columns = [Column(c, "key" if i == 0 else "number") for i, c in enumerate(columns)]

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)

    def print(self) -> None:
        print_fitted(console, self.columns, self.rows, title=self.title)


def _table(title: str, columns: tuple[str, ...]) -> _Rows:
    return _Rows(title, columns)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
