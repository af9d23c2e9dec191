"""The terminal view of a run: one subscriber to the engine's events, nothing more."""

from __future__ import annotations

import math

from solrl_view.safe_console import SafeConsole as Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column
from rich.text import Text

from solrl_view.run_summary import end_summary, eval_rewards_text, fmt
from solrl_view.stop_text import finished_message, stop_message
from solrl_view.words import GIF_NOTE, eval_started_text, mfu_text, written
from solrl_core import events as ev
from solrl_core.fault_text import FAULT_EVENTS, fault_message
from solrl_core.telemetry.mfu import describe
from solrl_core.text import plural


def memory_text(e: ev.IterationFinished) -> str:
    """'  peak <GiB> GiB (<phase>, <what was measured>)': the phase with the largest peak."""
    peaks = {k: v for k, v in (e.peak_memory or {}).items() if k != "total"}
    if not peaks:
        return ""
    phase = max(peaks, key=peaks.__getitem__)
    return f"  peak {peaks[phase]:.2f} GiB ({phase}, {e.memory_source})"


def emulation_note(e: ev.RunStarted) -> str:
    """On a CPU, a low-precision explore is an emulation in torch: Stage 1 keeps its numerics but runs
    slower than full precision would (`solrl rank-check RUN` measures both and says which to use)."""
    from solrl_core.precision.hardware import FULL_PRECISIONS

    if not str(e.device).startswith("cpu") or e.explore_precision in FULL_PRECISIONS:
        return ""
    return f" (an emulation on a CPU: slower than {e.dtype}; rank-check says which to use)"


class TerminalDisplay:
    """Short by default: a start header of a few lines and one 80-column line an iteration (the rest of
    each is in events.jsonl); `verbose` (`solrl train --verbose`): the machine's plan, the model's FLOPs,
    the explore copy and each iteration's phase times, memory and MFU in full."""

    def __init__(self, console: Console | None = None, verbose: bool = False) -> None:
        self.console = console or Console(highlight=False, markup=False)  # event texts are shown as written
        self.verbose = verbose
        # count, elapsed and ETA keep their width; the bar and then the label give way on a narrow terminal
        self.progress = Progress(TextColumn("[bold]train"),
                                 BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=5)),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 TextColumn("{task.description}",
                                            table_column=Column(ratio=2, no_wrap=True, overflow="ellipsis")),
                                 console=self.console, transient=True, expand=True)
        self.task: int | None = None
        self.label = ""  # the bar's label between evaluations: the last iteration's reward
        self.flops: ev.ModelFlops | None = None  # the run's model FLOPs and peaks: each iteration's MFU
        self.eval_started: ev.EvalStarted | None = None  # the evaluation running: its progress lines' clock
        self.eval_quarter = 0  # quarters of it already said (not on a terminal)
        self.gif_said = False  # the video extra's hint, said once

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, FAULT_EVENTS):
            self.console.print(Text.assemble(("warning:", "yellow"), f" {fault_message(event)}"))
            return
        handler = getattr(self, f"on_{event.kind}", None)
        if handler:
            handler(event)

    def on_run_started(self, e: ev.RunStarted) -> None:
        c = self.console
        verb = f"resuming at iteration {e.start_iteration}" if e.resumed else "starting"
        # the code or URL scored: a preset's name may say otherwise
        scored = f", reward {', '.join(e.rewards)}" if e.rewards else ""
        c.print(Text.assemble(("solrl", "bold"), f" {verb}: preset ", (e.preset, "cyan"),
                              f", {plural(e.iterations, 'iteration')}{scored}"))
        c.print(f"  device {e.device}, full precision {e.dtype}, explore precision "
                f"{e.explore_precision}{emulation_note(e)}")
        c.print(f"  {e.plan}")
        if e.machine and self.verbose:
            c.print(f"  this machine: {e.machine}")
        c.print(Text.assemble("  run dir ", (str(e.run_dir), "cyan")))
        for line in e.tracking:
            c.print(f"  {line}")
        if not self.verbose:
            c.print("  (the machine's plan, FLOPs, phase times, memory: events.jsonl, or train --verbose)")
        self.progress.start()
        self.task = self.progress.add_task("", total=e.iterations, completed=e.start_iteration)

    def on_model_flops(self, e: ev.ModelFlops) -> None:
        self.flops = e
        for line in describe(e) if self.verbose else ():
            self.console.print(f"  {line}")

    def on_quantization_report(self, e: ev.QuantizationReport) -> None:
        if self.verbose:
            self.console.print(f"  explore copy: {e.summary} (details: {e.path})")

    def on_iteration(self, e: ev.IterationFinished) -> None:
        s = e.seconds
        draft = f" draft {fmt(e.draft.mean)}" if e.draft else ""
        parts = [f"{k} {s[k]:.2f}s" for k in ("calibrate", "explore", "regenerate", "reward", "train", "sync")
                 if s.get(k)]
        warn = (f" ({plural(e.nonfinite_losses, 'non-finite loss', 'non-finite losses')} zeroed)" if e.nonfinite_losses
                else "")
        kl = e.loss["kl"]  # NaN with a finite loss: algorithm.kl_beta = 0, the reference is not run
        kl_text = f"{kl:.3g}" if math.isfinite(kl) or not math.isfinite(e.loss["loss"]) else "off"
        head = (f"iter {e.iteration:>4}/{e.iterations}  reward {fmt(e.final.mean)}{draft}  loss {e.loss['loss']:.4f} "
                f"kl {kl_text}")
        if self.verbose:
            self.console.print(f"{head}  |  {' '.join(parts)}  total "
                               f"{s['total']:.2f}s{memory_text(e)}{mfu_text(self.flops, s)}{warn}")
        else:  # one 80-column line: the phases, memory and MFU are in events.jsonl
            self.console.print(f"{head}  {s['total']:.1f}s{warn}")
        self.label = f"reward {fmt(e.final.mean)}"
        if self.task is not None:
            self.progress.update(self.task, completed=e.iteration, description=self.label)

    def on_compile_started(self, e: ev.CompileStarted) -> None:
        self.console.print(f"  compiling the {e.target} (torch.compile, once: minutes on a large model) ...")

    def on_compile(self, e: ev.CompileFinished) -> None:
        self.console.print(f"  compiled the {e.target} in {e.seconds:.1f}s (once, before the first iteration)")

    def on_eval_started(self, e: ev.EvalStarted) -> None:
        self.console.print(f"  {eval_started_text(e)} ...")
        self.eval_started, self.eval_quarter = e, 0
        if self.task is not None:
            self.progress.update(self.task, description=f"evaluating {e.weights} weights")

    def on_eval_progress(self, e: ev.EvalProgress) -> None:
        """On a terminal, the bar's label; otherwise (a log, a pipe, no bar drawn) a line at each quarter."""
        took = f", {e.time - self.eval_started.time:.0f}s" if self.eval_started is not None else ""
        text = f"evaluating {e.weights} weights: {e.done}/{e.total} images ({100 * e.done // max(1, e.total)}%{took})"
        if self.task is not None and self.console.is_terminal:
            self.progress.update(self.task, description=text)
            return
        quarter = 4 * e.done // max(1, e.total)
        if quarter > self.eval_quarter and e.done < e.total:
            self.console.print(f"  {text}")
        self.eval_quarter = max(self.eval_quarter, quarter)

    def on_images_progress(self, e: ev.ImagesProgress) -> None:
        """`solrl infer`: a line at each quarter of a weight set's images."""
        quarter = 4 * e.done // max(1, e.total)
        if e.done == 0 or quarter > self.eval_quarter and e.done < e.total:
            self.console.print(f"  {e.weights} weights: {e.done}/{e.total} images ({100 * e.done // max(1, e.total)}%)")
        self.eval_quarter = 0 if e.done >= e.total else max(self.eval_quarter, quarter)

    def on_eval(self, e: ev.EvalFinished) -> None:
        if self.task is not None:  # the evaluation is over: the bar no longer says it runs
            self.progress.update(self.task, description=self.label)
        extras = "".join(f"  {k.split('.')[-1]} {v:.3f}" for k, v in e.extras.items())
        took = f"base from {e.reused}" if e.reused else f"{e.seconds:.1f}s"
        self.console.print(f"  eval ({e.weights} weights, {e.prompts}, {plural(e.samples, 'image')}): reward "
                           f"{fmt(e.mean)}{extras}  ({took})")
        if e.eval_rewards:
            self.console.print(f"  eval rewards (not trained on): {eval_rewards_text(e)}")
        if e.picture:
            self.console.print(f"  picture: {e.picture}")

    def on_rank_check(self, e: ev.RankCheckResult) -> None:
        cor = " ".join(f"{n} {v:.3f}" if v is not None else f"{n} - (constant)"
                       for n, v in (("rho", e.rho), ("tau", e.tau)))
        self.console.print(f"  rank check (iteration {e.iteration}, '{e.prompt[:40]}', {plural(e.seeds, 'seed')}, "
                           f"draft vs full): {cor}  mean draft {fmt(e.draft_mean)} full {fmt(e.full_mean)}  "
                           f"({e.seconds:.1f}s{', full rollouts reused from the calibration' if e.reused else ''})")

    def on_calibration(self, e: ev.CalibrationDone) -> None:
        self.console.print(f"  calibration (before iteration {e.iteration}, {plural(e.prompts, 'prompt')} x "
                           f"{plural(e.seeds, 'seed')}, against "
                           f"{e.reference}{', precisions ' + ', '.join(e.precisions) if e.precisions else ''}, "
                           f"{e.seconds:.1f}s): Stage 1 at {e.chosen}: {e.why}")
        self.console.print("    recall/s by preview setting: " + "  ".join(
            f"{c['name']} {c['recall']:.2f}/{c['seconds']:.2f}s" for c in e.candidates))

    def on_images_written(self, e: ev.ImagesWritten) -> None:
        self.console.print(f"  {e.weights} weights: {written(e)} in {e.seconds:.1f}s -> {e.folder}")
        if e.clips == "gif" and not self.gif_said:
            self.gif_said = True
            self.console.print(Text(f"  {GIF_NOTE}"))  # Text: its "[video]" is not markup

    # written for the trackers (run.image_every): only the hint here
    def on_sample_grid(self, e: ev.SampleGrid) -> None:
        if e.video.endswith(".gif") and not self.gif_said:
            self.gif_said = True
            self.console.print(Text(f"  sample grid clips ({e.video}): {GIF_NOTE}"))

    def on_checkpoint(self, e: ev.CheckpointSaved) -> None:
        self.console.print(f"  checkpoint {e.path} ({e.seconds:.2f}s)")

    def on_stop_requested(self, e: ev.StopRequested) -> None:
        self.console.print(Text(stop_message(e), style="yellow"))

    def on_warning(self, e: ev.RunWarning) -> None:
        self.console.print(Text.assemble(("warning:", "yellow"), f" {e.message}"))

    def on_run_finished(self, e: ev.RunFinished) -> None:
        self.progress.stop()
        style = {"failed": "red", "interrupted": "yellow"}.get(e.reason, "green")
        self.console.print(Text(finished_message(e), style=style))
        for line in end_summary(e):
            self.console.print(line)
