"""What the TUI knows about a run, kept apart from how it is drawn: the event sources (a tailed
events.jsonl, or a live queue fed by the engine's bus; both yield plain event dicts) and `RunState`,
which folds events into bounded histories and running aggregates. No Textual import here."""

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
from typing import Any

from solrl_core.events import PHASES  # noqa: F401 - the TUI's phase order, importable from here
from solrl_core.rundir import EVENTS_FILE  # noqa: F401 - torch-free, as everything `solrl monitor` imports
PANELS = {"time": "time", "rewards": "rewards", "loss": "loss", "eval": "eval", "log": "warnings & log", "env": "environment"}
HISTORY = 2000  # iterations kept for plots; the aggregates count every iteration
ROLLING = 10


# ---------------------------------------------------------------- sources: each poll() returns new event dicts


class JsonlTail:
    """Follows RUN_DIR/events.jsonl: everything already there on the first poll, then appended lines.

    A last line still being written (no newline yet) waits for the next poll; a file that shrank
    (replaced) is read again from the start."""

    poll_interval = 0.5
    max_bytes = 8 << 20  # per poll, so replaying a huge log never freezes the screen

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self.finished = False  # another process writes the file: it may always grow

    def poll(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(min(size - self._offset, self.max_bytes))
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = {"event": "warning", "time": time.time(), "message": f"monitor: skipped an unreadable line of {self.path.name}"}
            if isinstance(record, dict) and "event" in record:
                out.append(record)
        return out


class QueueSource:
    """A bus subscriber for a run in this process: put_nowait on an unbounded queue (the trainer
    never blocks on the screen); the app converts events to dicts when it drains them."""

    poll_interval = 0.25

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()  # set by the training thread when train() returns or raises
        self.error: BaseException | None = None

    def __call__(self, event: Any) -> None:
        self._queue.put_nowait(event)

    def poll(self, limit: int = 10_000) -> list[dict[str, Any]]:
        out = []
        with contextlib.suppress(queue.Empty):
            while len(out) < limit:
                out.append(self._queue.get_nowait().to_dict())
        return out

    @property
    def finished(self) -> bool:
        return self.done.is_set() and self._queue.empty()


# ---------------------------------------------------------------- state: what the events say, kept apart from the view


class RunState:
    def __init__(self, history: int = HISTORY) -> None:
        self.started: dict[str, Any] | None = None
        self.quantization = ""
        self.iterations: deque[dict[str, Any]] = deque(maxlen=history)
        self.count = 0  # every iteration seen (the deque keeps the last `history`)
        self.phase_sums = dict.fromkeys(PHASES, 0.0)
        self.nonfinite = 0
        self.peak_memory: float | None = None  # GiB, the largest per-phase peak any iteration reported
        self.evals: deque[dict[str, Any]] = deque(maxlen=500)
        self.warnings: deque[dict[str, Any]] = deque(maxlen=50)
        self.warning_count = 0
        self.log: deque[str] = deque(maxlen=50)  # checkpoints, images, run finished
        self.finished: dict[str, Any] | None = None
        self.last_time: float | None = None
        self.version = 0  # bumped per event: the view redraws only when it moved

    def apply(self, e: dict[str, Any]) -> None:
        self.version += 1
        self.last_time = e.get("time", self.last_time)
        kind = e.get("event")
        if kind == "run_started":
            self.started, self.finished = e, None
            while self.iterations and self.iterations[-1]["iteration"] > e["start_iteration"]:
                self._drop(self.iterations.pop())  # logged after the checkpoint this run resumes from
        elif kind == "quantization_report":
            self.quantization = e["summary"]
        elif kind == "iteration":
            self.iterations.append(e)
            self.count += 1
            for k in PHASES:
                self.phase_sums[k] += e["seconds"].get(k, 0.0)
            self.nonfinite += e.get("nonfinite_losses", 0)
            peaks = [v for v in (e.get("peak_memory") or {}).values() if isinstance(v, (int, float))]
            if peaks:
                self.peak_memory = max(peaks + ([self.peak_memory] if self.peak_memory is not None else []))
        elif kind == "eval":
            self.evals.append(e)
        elif kind == "warning" or kind in FAULT_EVENTS:
            self.warnings.append(e if kind == "warning" else {**e, "message": fault_message(e)})
            self.warning_count += 1
        elif kind == "checkpoint":
            self.log.append(f"{_clock(e)} checkpoint iteration {e['iteration']} -> {e['path']} ({e['seconds']:.2f}s)")
        elif kind == "rank_check":
            cor = "  ".join(f"{n} {e[n]:.3f}" if e[n] is not None else f"{n} - (constant)" for n in ("rho", "tau"))
            self.log.append(f"{_clock(e)} rank check iteration {e['iteration']} ({e['seeds']} seeds of one prompt, draft vs "
                            f"full): {cor}")
        elif kind == "compile_started":
            self.log.append(f"{_clock(e)} compiling the {e['target']} (torch.compile, once) ...")
        elif kind == "compile":
            self.log.append(f"{_clock(e)} compiled the {e['target']} in {e['seconds']:.1f}s (once, before the first iteration)")
        elif kind == "sample_grid":
            self.log.append(f"{_clock(e)} sample grid iteration {e['iteration']} ({len(e['rewards'])} Stage-2 samples of "
                            f"'{e['prompt'][:40]}') -> {e['path']}")
        elif kind == "images_written":
            self.log.append(f"{_clock(e)} {e['count']} images ({e['weights']} weights) -> {e['folder']}")
        elif kind == "run_finished":
            self.finished = e
            self.log.append(f"{_clock(e)} run {e['reason']} at iteration {e['iteration']} after {e['seconds']:.1f}s")

    def _drop(self, it: dict[str, Any]) -> None:
        self.count -= 1
        for k in PHASES:
            self.phase_sums[k] -= it["seconds"].get(k, 0.0)
        self.nonfinite -= it.get("nonfinite_losses", 0)

    @property
    def iteration(self) -> int:
        if self.iterations:
            return self.iterations[-1]["iteration"]
        return self.started["start_iteration"] if self.started else 0

    @property
    def total(self) -> int:
        if self.started:  # a resumed run may have raised it
            return self.started["iterations"]
        return self.iterations[-1]["iterations"] if self.iterations else 0

    def series(self, *path: str) -> list[float]:
        """One number per kept iteration, e.g. series("final", "mean"); iterations lacking it (or where it is
        NaN: an iteration whose rewards were all non-finite, or that made no step) are skipped."""
        out = []
        for it in self.iterations:
            value: Any = it
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, (int, float)) and math.isfinite(value):
                out.append(float(value))
        return out

    def points(self, *path: str) -> tuple[list[float], list[float]]:
        """(iterations, values) of series(*path): the x and y of a chart."""
        xs, ys = [], []
        for it in self.iterations:
            value: Any = it
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, (int, float)):
                xs.append(float(it["iteration"]))
                ys.append(float(value))
        return xs, ys

    def components(self, stage: str) -> list[str]:
        last = next((it[stage] for it in reversed(self.iterations) if it.get(stage)), None)
        return sorted(last["components"]) if last else []

    def rolling(self, phase: str) -> float | None:
        recent = [it["seconds"][phase] for it in itertools.islice(reversed(self.iterations), ROLLING) if phase in it["seconds"]]
        return statistics.fmean(recent) if recent else None

    def explore_speed(self) -> list[str]:
        """Stage-1 versus Stage-2 generation speed, from the timings and the run's config (sol_rl only:
        the one family that generates the same seeds in both stages). Empty when not derivable."""
        from solrl_core.config import Config, from_dict

        t_draft, t_final = self.rolling("explore"), self.rolling("regenerate")
        if not self.started or not t_draft or not t_final:
            return []
        cfg = from_dict(self.started["config"], Config(), source="the run's start event")  # typed: drift is an error
        if cfg.algorithm.family != "sol_rl":
            return []
        prompts, n, k = cfg.run.prompts_per_iteration, cfg.explore.group_size, cfg.selection.group_size
        steps_draft, steps_final = cfg.explore.steps, cfg.sampler.steps
        draft, final = prompts * n / t_draft, prompts * k / t_final
        return [f"Stage 1 draft rollouts: {prompts} prompts x {n} seeds in {t_draft:.2f}s = {draft:.1f}/s "
                f"({steps_draft} steps, {self.started['explore_precision']})",
                f"Stage 2 final rollouts: {prompts} prompts x {k} seeds in {t_final:.2f}s = {final:.1f}/s "
                f"({steps_final} steps, {self.started['dtype']})",
                f"explore speed-up per rollout {draft / final:.2f}x, per denoising step "
                f"{draft * steps_draft / (final * steps_final):.2f}x  (generation time only, mean of the last "
                f"{min(len(self.iterations), ROLLING)} iterations)"]

    def eta(self) -> float | None:
        per = self.rolling("total")
        return None if per is None or self.finished else per * max(self.total - self.iteration, 0)


FAULT_EVENTS = ("oom_backoff", "samples_dropped", "step_skipped")


def fault_message(e: dict[str, Any]) -> str:
    """One line for a fault the run survived (solrl_core/faults), shown as a warning by every view."""
    kind = e["event"]
    if kind == "oom_backoff":
        return (f"out of GPU memory in the {e['phase']} (iteration {e['iteration']}): {e['setting']} {e['old']} -> {e['new']}, "
                "iteration redone")
    if kind == "samples_dropped":
        named = ", ".join(f"'{name}' {count}" for name, count in e["rewards"].items())
        explore = e["stage"] == "explore"
        where = "not selected" if explore else "left out of the update"
        lost = "had no finite draft" if explore else "skipped"
        groups = f"; {e['groups_skipped']} of {e['groups']} prompt groups {lost}" if e["groups_skipped"] else ""
        return (f"non-finite rewards in iteration {e['iteration']} ({e['stage']}): {named}; {e['dropped']} of {e['samples']} "
                f"samples {where}{groups}")
    if kind == "step_skipped":
        limit = f" (the run stops at {e['limit']})" if e["limit"] else ""
        return f"optimizer step of iteration {e['iteration']} skipped: {e['reason']}, {e['in_a_row']} in a row{limit}"
    return str(e)


def thin(xs: list[float], ys: list[float], points: int) -> tuple[list[float], list[float]]:
    """At most `points` points: consecutive buckets of equal size replaced by their means, so a chart
    of thousands of iterations costs what one screen width costs."""
    n = len(xs)
    if n <= points or points < 1:
        return xs, ys
    edges = [round(i * n / points) for i in range(points + 1)]
    return ([statistics.fmean(xs[a:b]) for a, b in zip(edges, edges[1:])],
            [statistics.fmean(ys[a:b]) for a, b in zip(edges, edges[1:])])


def _clock(e: dict[str, Any]) -> str:
    return time.strftime("%H:%M:%S", time.localtime(e["time"])) if "time" in e else "--:--:--"


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


def gpu_line() -> str:
    """Utilisation and memory of this machine's GPUs, when nvidia-ml-py imports and finds one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        parts = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            parts.append(f"gpu{i} {pynvml.nvmlDeviceGetUtilizationRates(handle).gpu}% "
                         f"mem {mem.used / 2**30:.1f}/{mem.total / 2**30:.1f} GiB")
    except Exception:  # noqa: BLE001 - not installed, no driver, no device: all mean the same here
        return "GPU: no GPU"
    return "GPU: " + ("  ".join(parts) if parts else "no GPU")
