"""What the TUI knows about a run, kept apart from how it is drawn: the event sources (a tailed
events.jsonl decoded by `events.decode`, or a live queue fed by the engine's bus; both yield typed
events) and `RunState`, which folds events into bounded histories and running aggregates. No Textual
import here, and nothing that imports torch: `solrl monitor` starts fast."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import queue
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, TypedDict

from solrl_view.run_summary import fmt
from solrl_view.stop_text import finished_message, stop_message
from solrl_view.words import eval_line, iteration_line, log_line
from solrl_core import events as ev
from solrl_core.config.convert import from_dict
from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError
from solrl_core.event_bus import TooDeep, parse_line
from solrl_core.events import PHASES
from solrl_core.fault_text import FAULT_EVENTS, fault_message
from solrl_core.faults.links import check_path
from solrl_core.telemetry.mfu import describe, percent, phase_mfu
from solrl_core.text import plural

PANELS = {"time": "time", "rewards": "rewards", "loss": "loss", "eval": "eval", "log": "warnings & log",
          "env": "environment"}
HISTORY = 2000  # iterations kept for plots; the aggregates count every iteration
ROLLING = 10


# ---------------------------------------------------------------- sources: each poll() returns new typed events


class JsonlTail:
    """Follows RUN_DIR/events.jsonl: everything already there on the first poll, then appended lines.

    A last line still being written (no newline yet) waits for the next poll; a file that shrank
    (replaced) is read again from the start. Lines are decoded by `events.decode`: a line that is not
    JSON (torn by a crash mid-write) becomes a warning; a kind this version does not know (a newer
    solrl wrote it) is skipped, counted in `skipped`, and its first line of each kind becomes a
    warning; a line of a known kind whose fields do not fit raises SolrlError naming the line, and
    the monitor stops with it, since drawing the rest would hide a changed schema."""

    poll_interval = 0.5
    max_bytes = 8 << 20  # per poll, so replaying a huge log never freezes the screen

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self.finished = False  # another process writes the file: it may always grow
        self.lines = 0  # complete lines read so far, to name a bad one
        self.skipped: dict[str, int] = {}  # events of kinds this version does not know, by kind

    def poll(self) -> list[ev.Event]:
        try:
            size = check_path(self.path.parent, self.path.name).stat().st_size  # a planted link or fifo: refused
        except FileNotFoundError:
            return []
        if size < self._offset:
            self._offset, self._partial, self.lines = 0, b"", 0
        if size == self._offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(min(size - self._offset, self.max_bytes))
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out: list[ev.Event] = []
        for line in lines:
            self.lines += 1
            if line.strip():
                event = self._decode(line)
                if event is not None:
                    out.append(event)
        return out

    def _decode(self, line: bytes) -> ev.Event | None:
        where = f"{self.path.name} line {self.lines}"
        try:
            record = parse_line(line)
        except TooDeep as exc:
            raise SolrlError(f"{self.path} line {self.lines}: {exc}", "the file is damaged: its other lines are not "
                                                                      "shown") from exc
        except ValueError:
            return ev.RunWarning(message=f"monitor: skipped {where}, which is not JSON (torn by a crash mid-write?)")
        try:
            return ev.decode(record)
        except ev.UnknownEventKind as exc:
            self.skipped[str(exc.kind)] = self.skipped.get(str(exc.kind), 0) + 1
            if self.skipped[str(exc.kind)] > 1:
                return None
            return ev.RunWarning(message=f"monitor: skipped {where} and any later '{exc.kind}' events: a newer solrl "
                                         "wrote this kind, which this version does not know")
        except ev.EventDecodeError as exc:
            raise SolrlError(f"{self.path} line {self.lines}: {exc}",
                             "the file is damaged, or another solrl version wrote it: replay it with that "
                             "version") from exc


class QueueSource:
    """A bus subscriber for a run in this process: put_nowait on an unbounded queue (the trainer
    never blocks on the screen); the app drains the typed events on its timer."""

    poll_interval = 0.25

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()  # set by the training thread when train() returns or raises
        self.error: BaseException | None = None

    def __call__(self, event: ev.Event) -> None:
        self._queue.put_nowait(event)

    def poll(self, limit: int = 10_000) -> list[ev.Event]:
        out: list[ev.Event] = []
        with contextlib.suppress(queue.Empty):
            while len(out) < limit:
                out.append(self._queue.get_nowait())
        return out

    @property
    def finished(self) -> bool:
        return self.done.is_set() and self._queue.empty()


# ---------------------------------------------------------------- state: what the events say, kept apart from the view


class WarningLine(TypedDict):
    """One line of the warnings list: a RunWarning, or a fault the run survived, in words."""

    time: float
    message: str


class RunState:
    """The run as its typed events tell it. `apply` takes an event, or an events.jsonl record, which
    it decodes first (`events.decode`: an unknown kind or a record that does not fit raises)."""

    def __init__(self, history: int = HISTORY) -> None:
        self.started: ev.RunStarted | None = None
        # the last calibration since the start: Stage 1's steps and precision
        self.calibrated: ev.CalibrationDone | None = None
        self.config: Config | None = None  # the run's config, typed, from its start event
        self.quantization = ""
        self.flops: ev.ModelFlops | None = None  # the run's model FLOPs and peaks: each iteration's MFU
        self.iterations: deque[ev.IterationFinished] = deque(maxlen=history)
        self.count = 0  # every iteration seen (the deque keeps the last `history`)
        self.phase_sums = dict.fromkeys(PHASES, 0.0)
        self.nonfinite = 0
        self.peak_memory: float | None = None  # GiB, the largest per-phase peak any iteration reported
        self.evals: deque[ev.EvalFinished] = deque(maxlen=500)
        self.warnings: deque[WarningLine] = deque(maxlen=50)
        self.warning_count = 0
        self.log: deque[str] = deque(maxlen=200)  # iterations, evaluations, checkpoints, images, run finished
        self.evaluating: ev.EvalStarted | None = None  # the evaluation running now, and how far it is
        self.eval_progress: ev.EvalProgress | None = None
        self.finished: ev.RunFinished | None = None
        self.last_time: float | None = None
        self.version = 0  # bumped per event: the view redraws only when it moved

    def apply(self, e: ev.Event | dict[str, Any]) -> None:
        if not isinstance(e, dict):  # a live run's event holds strings of its config and folder: read as a logged one
            e = json.loads(json.dumps(e.to_dict()))
        e = ev.decode(e)  # every string printable (text.printable): the view shows it, never a terminal control
        self.version += 1
        self.last_time = e.time
        if isinstance(e, ev.RunStarted):
            self.started, self.finished, self.flops, self.calibrated, self.evaluating = e, None, None, None, None
            self.config = from_dict(e.config, Config(), source="the run's start event")  # typed: drift is an error
            while self.iterations and self.iterations[-1].iteration > e.start_iteration:
                self._drop(self.iterations.pop())  # logged after the checkpoint this run resumes from
        elif isinstance(e, ev.QuantizationReport):
            self.quantization = e.summary
        elif isinstance(e, ev.ModelFlops):
            self.flops = e
            self.log.extend(f"{_clock(e.time)} {line}" for line in describe(e))
        elif isinstance(e, ev.IterationFinished):
            self.iterations.append(e)
            self.log.append(f"{_clock(e.time)} {iteration_line(e)}")
            self.count += 1
            for k in PHASES:
                self.phase_sums[k] += e.seconds.get(k, 0.0)
            self.nonfinite += e.nonfinite_losses
            peaks = [v for v in (e.peak_memory or {}).values() if isinstance(v, (int, float))]
            if peaks:
                self.peak_memory = max(peaks + ([self.peak_memory] if self.peak_memory is not None else []))
        elif isinstance(e, ev.EvalStarted):
            self.evaluating, self.eval_progress = e, None
            self.log.append(f"{_clock(e.time)} {log_line(e)}")
        elif isinstance(e, ev.EvalProgress):
            self.eval_progress = e
        elif isinstance(e, ev.EvalFinished):
            self.evals.append(e)
            self.evaluating = self.eval_progress = None
            self.log.append(f"{_clock(e.time)} {eval_line(e, self.evals[0])}")
        elif isinstance(e, ev.CalibrationDone):
            self.calibrated = e
            self.log.append(f"{_clock(e.time)} {log_line(e)}")
        elif isinstance(e, (ev.RunWarning, *FAULT_EVENTS)):
            self.warnings.append({"time": e.time,
                                  "message": e.message if isinstance(e, ev.RunWarning) else fault_message(e)})
            self.warning_count += 1
        elif isinstance(e, ev.RunFinished):
            self.finished, self.evaluating = e, None  # a stop drops an evaluation in progress
            self.log.append(f"{_clock(e.time)} run {e.reason} at iteration {e.iteration} after {e.seconds:.1f}s: "
                            f"{finished_message(e, self.total)}")
        elif isinstance(e, ev.StopRequested):
            self.log.append(f"{_clock(e.time)} {stop_message(e)}")
        else:
            line = log_line(e)
            if line:
                self.log.append(f"{_clock(e.time)} {line}")

    def _drop(self, it: ev.IterationFinished) -> None:
        self.count -= 1
        for k in PHASES:
            self.phase_sums[k] -= it.seconds.get(k, 0.0)
        self.nonfinite -= it.nonfinite_losses

    @property
    def iteration(self) -> int:
        if self.iterations:
            return self.iterations[-1].iteration
        return self.started.start_iteration if self.started else 0

    @property
    def total(self) -> int:
        if self.started:  # a resumed run may have raised it
            return self.started.iterations
        return self.iterations[-1].iterations if self.iterations else 0

    def series(self, *path: str) -> list[float]:
        """One number per kept iteration, e.g. series("final", "mean"); iterations lacking it (or where it is
        NaN: an iteration whose rewards were all non-finite, or that made no step) are skipped."""
        return [y for _, y in self._pairs(path) if math.isfinite(y)]

    def points(self, *path: str) -> tuple[list[float], list[float]]:
        """(iterations, values) of series(*path): the x and y of a chart."""
        pairs = self._pairs(path)
        return [x for x, _ in pairs], [y for _, y in pairs]

    def _pairs(self, path: tuple[str, ...]) -> list[tuple[float, float]]:
        """(iteration, value) where the iteration has a number at `path`: attributes of the event (a
        name it lacks is an AttributeError: a bug here, not in the data), then keys of its dicts."""
        out = []
        for it in self.iterations:
            value: Any = it
            for key in path:
                value = value.get(key) if isinstance(value, dict) else getattr(value,
                                                                               key) if value is not None else None
            if isinstance(value, (int, float)):
                out.append((float(it.iteration), float(value)))
        return out

    def components(self, stage: str) -> list[str]:
        last = next((getattr(it, stage) for it in reversed(self.iterations) if getattr(it, stage)), None)
        return sorted(last.components) if last else []

    def rolling(self, phase: str) -> float | None:
        recent = [it.seconds[phase] for it in itertools.islice(reversed(self.iterations), ROLLING)
                  if phase in it.seconds]
        return statistics.fmean(recent) if recent else None

    def explore_speed(self) -> list[str]:
        """Stage-1 versus Stage-2 generation speed, from the timings and the stages the run reported: its
        plan in the start event, Stage 1 at the last calibration's choice after one (sol_rl only: the one
        family that generates the same seeds in both stages). Empty when not derivable (a log written
        before the start event held the plan)."""
        t_draft, t_final = self.rolling("explore"), self.rolling("regenerate")
        s, cfg = self.started, self.config
        if not s or cfg is None or not t_draft or not t_final or not (s.regenerate and s.explore_seeds):
            return []
        prompts, n, k = cfg.run.prompts_per_iteration, s.explore_seeds, s.keep
        steps_draft, steps_final = (self.calibrated.steps if self.calibrated else s.explore_steps), s.full_steps
        precision = self.calibrated.precision if self.calibrated else s.explore_precision
        draft, final = prompts * n / t_draft, prompts * k / t_final
        why = ""
        if draft * steps_draft < final * steps_final and precision not in ("bf16", "fp32", "fp16"):
            why = (f"; below 1x: {precision} is " + ("an emulation in torch, slower than full precision on this device"
                                                     if "emulated" in precision or s.device == "cpu" else
                                                     "slower than full precision here") + ": --explore-precision fp32 "
                                                                                          "may be faster")
        return [f"Stage 1 drafts: {plural(prompts, 'prompt')} x {plural(n, 'seed')} in {t_draft:.2f}s = {draft:.1f}/s "
                f"({steps_draft} steps, {precision})",
                f"Stage 2 finals: {plural(prompts, 'prompt')} x {plural(k, 'seed')} in {t_final:.2f}s = {final:.1f}/s "
                f"({steps_final} steps, {s.dtype})",
                f"explore speed-up per rollout {draft / final:.2f}x, per denoising step "
                f"{draft * steps_draft / (final * steps_final):.2f}x (generation only, last "
                f"{plural(min(len(self.iterations), ROLLING), 'iteration')}{why})"]

    def progress_text(self) -> str:
        """The header's progress: 'iteration 3/30 eta ~2m10s evaluating ema: 96/256 images reward 0.53 (draft 0.43) MFU
        3.4%'."""
        parts = [f"iteration {self.iteration}/{self.total}"]
        eta = self.eta()
        if eta is not None:  # next to the count: a narrow header cuts the end of the line, never the eta
            parts.append(f"eta ~{_duration(eta)}")
        if self.evaluating:
            done = self.eval_progress.done if self.eval_progress is not None else 0
            parts.append(f"evaluating {self.evaluating.weights}: {done}/{self.evaluating.samples} images")
        if self.iterations:
            it = self.iterations[-1]
            parts.append(f"reward {fmt(it.final.mean)}" + (f" (draft {fmt(it.draft.mean)})" if it.draft else ""))
            mfu = self.mfu()
            if mfu:  # the run's model FLOPs were counted (telemetry/model_flops.py)
                parts.append(f"MFU {percent(mfu['total'])}")
        return "  ".join(parts)

    def explore_speed_note(self) -> str:
        """Why explore_speed() is empty, in words."""
        s = self.started
        if s is None:
            return "explore speed-up: once the run has started (its start event holds the plan's stages)"
        if not s.explore_seeds:
            return ("explore speed-up: not derivable from these events (an older solrl wrote them, without the plan's "
                    "stages)")
        if not s.regenerate:
            family = self.config.algorithm.family if self.config is not None else "this family"
            return f"explore speed-up: none to show ({family} generates each rollout once: no Stage 2 to compare with)"
        if self.iterations:  # a plan with two stages whose iterations timed neither (or one took 0 s)
            return "explore speed-up: not derivable (the iterations seen report no explore and regenerate seconds)"
        return (f"explore speed-up: after the first iteration (Stage 1: {plural(s.explore_seeds, 'seed')}/prompt at "
                f"{s.explore_steps} steps, Stage 2: the kept {s.keep} at {s.full_steps} steps)")

    def evaluation_text(self) -> str:
        """'evaluating the ema weights on SET: 96/256 images (after iteration 10)' while one runs, else ''."""
        e = self.evaluating
        if e is None:
            return ""
        done = self.eval_progress.done if self.eval_progress is not None else 0
        after = f" (after iteration {e.iteration})" if e.iteration else ""
        return f"evaluating the {e.weights} weights on {e.prompts}: {done}/{e.samples} images{after}"

    def outcome_text(self) -> str:
        """How the run ended, when and where it stopped: 'run completed 11:14:28 (2/2 iterations, 7.7s)';
        '' while it has not."""
        e = self.finished
        if e is None:
            return ""
        took = e.total_seconds if e.total_seconds is not None else e.seconds
        then = time.localtime(e.time)
        when = time.strftime("%H:%M:%S" if then[:3] == time.localtime()[:3] else "%Y-%m-%d %H:%M", then)
        word = "stopped" if e.reason == "interrupted" or (e.reason == "completed"
                                                          and e.iteration < self.total) else e.reason
        return f"run {word} {when} ({e.iteration}/{self.total} iterations, {took:.1f}s)" if took < 60 else \
            f"run {word} {when} ({e.iteration}/{self.total} iterations, {_duration(took)})"

    def warning_lines(self) -> list[str]:
        """The warnings panel's list, as lines: 'N warnings (the last M):' then each, with its time."""
        if not self.warning_count:
            return []
        kept = f" (the last {len(self.warnings)})" if self.warning_count > len(self.warnings) else ""
        return [f"{plural(self.warning_count, 'warning')}{kept}:",
                *(f"  {_clock(w['time'])} {w['message']}" for w in self.warnings)]

    def mfu(self) -> dict[str, float | None]:
        """The last iteration's model FLOPs utilisation per phase and in total (telemetry/mfu.py); {} when
        the run's FLOPs were not counted or no iteration finished."""
        return phase_mfu(self.flops, self.iterations[-1].seconds) if self.iterations else {}

    def eta(self) -> float | None:
        per = self.rolling("total")
        return None if per is None or self.finished else per * max(self.total - self.iteration, 0)


def thin(xs: list[float], ys: list[float], points: int) -> tuple[list[float], list[float]]:
    """At most `points` points: consecutive buckets of equal size replaced by their means, so a chart
    of thousands of iterations costs what one screen width costs."""
    n = len(xs)
    if n <= points or points < 1:
        return xs, ys
    edges = [round(i * n / points) for i in range(points + 1)]
    return ([statistics.fmean(xs[a:b]) for a, b in zip(edges, edges[1:])],
            [statistics.fmean(ys[a:b]) for a, b in zip(edges, edges[1:])])


def _clock(seconds: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds)) if seconds is not None else "--:--:--"


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"

