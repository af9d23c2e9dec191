"""Typed events out of the engine. Renderers (terminal, JSONL log, a later TUI) subscribe to a bus.

The engine never formats output itself: every number a user sees travels as one of these events,
so a live run and a replay of `events.jsonl` show the same thing.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from solrl_core.event_bus import (  # noqa: F401  (re-exported: ev.EventBus, ev.JsonlLog, ev.EventDecodeError, ...)
    JSON_TYPES, EventBus, EventDecodeError, JsonlLog, Subscriber, UnknownEventKind, shown)
from solrl_core.text import printable_data

PHASES = ("explore", "selection", "regenerate", "reward", "train", "sync", "total")


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"
    time: float = field(default_factory=time.time, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class RunStarted(Event):
    kind: ClassVar[str] = "run_started"
    run_dir: str
    preset: str
    device: str
    dtype: str
    explore_precision: str
    plan: str
    start_iteration: int
    iterations: int
    resumed: bool
    config: dict[str, Any]
    machine: str = ""  # what the auto switches chose here, and why (resolve.py)
    copy_layout: str = ""  # under fsdp: the explore copy whole or sharded like the policy (why: `machine`)
    environment: dict[str, Any] = field(default_factory=dict)  # what the run started on: environment.describe()
    tracking: list[str] = field(default_factory=list)  # where each tracker writes, and how to look at it
    rewards: list[str] = field(default_factory=list)  # trained on: each reward as the code or URL it runs
    # the plan's stages as this session starts (a resumed calibration's choice held: stage1.hold_calibration);
    # a later CalibrationDone changes Stage 1's steps and precision. 0: a log written before these fields
    explore_seeds: int = 0  # seeds per prompt in Stage 1
    explore_steps: int = 0
    keep: int = 0  # K, the seeds per prompt trained on
    regenerate: bool = False  # Stage 2 regenerates the kept seeds at full steps and the run dtype
    full_steps: int = 0


@dataclass(frozen=True)
class QuantizationReport(Event):
    kind: ClassVar[str] = "quantization_report"
    summary: str
    path: str


@dataclass(frozen=True)
class RewardStats:
    mean: float
    std: float
    best: float
    worst: float
    components: dict[str, float]


@dataclass(frozen=True)
class IterationFinished(Event):
    kind: ClassVar[str] = "iteration"
    iteration: int
    iterations: int
    seconds: dict[str, float]
    draft: RewardStats | None
    final: RewardStats
    loss: dict[str, float]
    nonfinite_losses: int
    grad_norm: float
    old_decay: float
    # Peak memory of each phase, GiB: the GPU's peak allocated (CUDA), or on a CPU the process's peak
    # resident memory so far (which only grows). `memory_source` says which.
    peak_memory: dict[str, float] | None = None
    memory_source: str = ""


@dataclass(frozen=True)
class CompileStarted(Event):
    """A torch.compile warm-up begins (seconds on a small model, minutes on a large one)."""

    kind: ClassVar[str] = "compile_started"
    target: str  # as CompileFinished


@dataclass(frozen=True)
class CompileFinished(Event):
    """A rollout copy or the update compiled (torch.compile, on warm-up calls) before the first
    iteration, so the first iteration is not read as a slow one."""

    kind: ClassVar[str] = "compile"
    target: str  # "explore copy" | "rollout copy" | "update"
    seconds: float


@dataclass(frozen=True)
class EvalStarted(Event):
    """An evaluation begins (minutes on a large model): which weights, on what, how many images."""

    kind: ClassVar[str] = "eval_started"
    iteration: int
    weights: str
    prompts: str
    samples: int


@dataclass(frozen=True)
class EvalProgress(Event):
    """An evaluation moves on: images generated so far (reported every few batches, and at the end)."""

    kind: ClassVar[str] = "eval_progress"
    iteration: int
    weights: str
    done: int
    total: int


@dataclass(frozen=True)
class EvalFinished(Event):
    kind: ClassVar[str] = "eval"
    iteration: int
    weights: str  # "base" | "ema"
    prompts: str
    samples: int
    mean: float
    components: dict[str, float]
    extras: dict[str, float]  # reward-defined statistics, e.g. tinyworld_geneval.strict_accuracy
    seconds: float
    # standard errors of the change since this process's base evaluation (same prompts and seeds):
    # "mean" and each per-group extra (e.g. tinyworld_geneval.count); empty for the base or after a resume
    delta_se: dict[str, float] = field(default_factory=dict)
    # run.eval_rewards: each one's mean on the same images (scored in evaluation only, never trained on)
    eval_rewards: dict[str, float] = field(default_factory=dict)
    eval_changes: dict[str, float] = field(default_factory=dict)  # each one's change since the base ({}: no base)
    eval_se: dict[str, float] = field(default_factory=dict)  # the paired standard error of each of those changes
    reused: str = ""  # the file these scores were read back from, its digest checked; '' when scored now
    picture: str = ""  # a training run's picture: base beside these weights on a few images (eval_pictures.py)
    eval_floors: dict[str, float] = field(default_factory=dict)  # each one's hacking floor (loop/hacking.py)
    kept: str = ""  # a run's base: the SHA-256 of the scores kept in eval_base.json, checked before reuse
    # the trained-reward gain since evaluation `trade_since` per unit of each eval reward lost since then
    # (loop/frontier.py); a reward that lost nothing beyond its noise is left out; trade_since -1: not measured
    trade: dict[str, float] = field(default_factory=dict)
    trade_since: int = -1


@dataclass(frozen=True)
class RewardHacking(Event):
    """After an evaluation: the trained reward (the evaluation's total) rose since the base while an
    eval reward fell by more than `threshold` paired standard errors and more than its `floor`: the
    images may be degrading in ways the trained reward does not see (loop/hacking.py)."""

    kind: ClassVar[str] = "reward_hacking"
    iteration: int
    trained: str  # the trained reward(s), as reward.weights names them
    trained_change: float  # the total's change since the base
    trained_se: float
    reward: str  # the eval reward that fell
    change: float
    se: float
    threshold: float  # in standard errors
    stopping: bool  # run.on_hacking is stop or rollback: the run does not go on from this iteration
    floor: float = 0.0  # the fall that counts (run.hacking_floors or the reward's declared floor); 0 in older logs
    action: str = ""  # run.on_hacking: warn, stop or rollback ('' in older logs: stopping says which of warn and stop)


@dataclass(frozen=True)
class RolledBack(Event):
    """run.on_hacking=rollback: after the evaluation of `iteration` was flagged, the run went back to
    `checkpoint` (iteration `to`, the newest whose evaluation no rule flagged), set the later
    checkpoints aside, and goes on as `then` says (run.rollback_then)."""

    kind: ClassVar[str] = "rolled_back"
    iteration: int
    to: int
    checkpoint: str
    then: str  # stop, or lower_lr: training goes on at `lr`
    lr: float
    rollbacks: int  # in this run so far, this one included
    set_aside: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CheckpointSaved(Event):
    kind: ClassVar[str] = "checkpoint"
    iteration: int
    path: str
    seconds: float


@dataclass(frozen=True)
class RunWarning(Event):
    kind: ClassVar[str] = "warning"
    message: str


@dataclass(frozen=True)
class OutOfMemoryBackoff(Event):
    """A phase ran out of GPU memory: its batch was halved and the iteration is redone from its start."""

    kind: ClassVar[str] = "oom_backoff"
    iteration: int  # the iteration redone
    phase: str  # rollout | reward | evaluation | update
    setting: str  # the config key halved, e.g. sampler.rollout_batch
    old: int
    new: int


@dataclass(frozen=True)
class SamplesDropped(Event):
    """Samples whose reward was NaN or infinite, left out of selection (explore) or of the update (final)."""

    kind: ClassVar[str] = "samples_dropped"
    iteration: int
    stage: str  # "explore" | "final"
    rewards: dict[str, int]  # reward -> samples it scored non-finite
    dropped: int  # samples with any non-finite score
    samples: int
    groups_skipped: int  # prompt groups with no finite sample
    groups: int


@dataclass(frozen=True)
class StepSkipped(Event):
    """An optimizer step not taken: its gradient norm was not finite, or no loss term was."""

    kind: ClassVar[str] = "step_skipped"
    iteration: int
    reason: str
    in_a_row: int
    limit: int  # optimizer.max_nonfinite_steps; 0 = never stop


@dataclass(frozen=True)
class RankCheckResult(Event):
    """In-run check of the Stage-1 proxy: one prompt's N draft rewards against the same seeds at full
    precision and full steps."""

    kind: ClassVar[str] = "rank_check"
    iteration: int
    prompt: str
    seeds: int
    rho: float | None  # None: one side was constant
    tau: float | None
    draft_mean: float
    full_mean: float
    seconds: float
    reused: bool = False  # the full-precision rollouts were the same iteration's calibration's (not regenerated)


@dataclass(frozen=True)
class CalibrationDone(Event):
    """Stage 1's preview steps (and with steps+precision its precision) chosen from measured rank fidelity
    (explore.calibrate, calibration.py):
    every candidate's recall of the full-precision selection, correlations and seconds, and the choice."""

    kind: ClassVar[str] = "calibration"
    iteration: int  # the iteration whose Stage 1 first runs at the choice
    prompts: int
    seeds: int  # per prompt
    reference: str  # precision@steps the candidates are compared with
    candidates: list[dict[str, Any]]  # calibration.Measured's fields: name, precision, steps, recall, ..., cost
    chosen: str  # precision@steps
    steps: int
    precision: str
    min_recall: float  # the floor used
    why: str
    fixed_steps: int  # explore.steps: the fixed setting the floor is measured from
    seconds: float  # the whole calibration, counted in the iteration's time
    precisions: list[str] = field(default_factory=list)  # steps+precision: the precisions weighed ([]: steps)
    fixed: str = ""  # precision@steps of the fixed setting


@dataclass(frozen=True)
class ImagesWritten(Event):
    kind: ClassVar[str] = "images_written"
    weights: str
    count: int
    seconds: float
    folder: str
    clips: str = ""  # a video model's clips' format: "mp4", or "gif" without the video extra; "" images


@dataclass(frozen=True)
class ImagesProgress(Event):
    """`solrl infer` moves on: images (or clips) of one weight set generated so far, of `total`."""

    kind: ClassVar[str] = "images_progress"
    weights: str
    done: int
    total: int


@dataclass(frozen=True)
class SampleGrid(Event):
    """One prompt's Stage-2 samples, best reward first, written as one PNG (every run.image_every
    iterations while a tracker is configured); a video model's clips also as one video, side by side."""

    kind: ClassVar[str] = "sample_grid"
    iteration: int
    prompt: str
    rewards: list[float]  # left to right, as in the picture
    path: str
    seconds: float
    seeds: list[int] = field(default_factory=list)  # left to right, as in the picture
    video: str = ""  # a video model's clips side by side, in the picture's order (MP4, or GIF without the video extra)


@dataclass(frozen=True)
class RunFinished(Event):
    kind: ClassVar[str] = "run_finished"
    reason: str  # "completed" | "interrupted" | "failed"
    iteration: int
    seconds: float
    first_reward: float | None
    last3_reward: float | None  # the mean of the last `last_iterations` iterations (at most 3, never the first)
    run_dir: str = ""
    checkpoint: str | None = None  # the newest complete checkpoint on disk as the run ended (None: none)
    # the end summary's evaluations (EvalFinished records): the base, kept in the run folder, and this session's last
    base_eval: dict[str, Any] | None = None
    last_eval: dict[str, Any] | None = None
    total_seconds: float | None = None  # every session of the run together (`seconds`: this session's)
    resumable: bool = True  # False: the error it failed with says a resume would not help (a diverged update)
    last_iterations: int = 0  # iterations last3_reward averages; 0: a log older than this field (the last 3)


@dataclass(frozen=True)
class StopRequested(Event):
    """A stop was asked (a signal or the TUI's q), acknowledged at once with what the run waits for
    (solrl_core/runtime/stopping.py)."""

    kind: ClassVar[str] = "stop_requested"
    source: str  # Ctrl-C, SIGTERM, SIGHUP, q
    mode: str  # "iteration": finish it and save; "phase": abandon it at the next phase boundary unless its update ran
    iteration: int  # the iteration in progress, 1-based (0: none started yet)
    phase: str  # the phase running when asked ("evaluation" during one; "" between iterations)
    run_dir: str
    checkpoint: str | None  # the newest complete checkpoint on disk when asked (None: none yet)


@dataclass(frozen=True)
class BenchProgress(Event):
    """`solrl bench` moves on: building the model, counting its FLOPs, training a family, measuring
    the device (minutes on a GPU, so each step is said as it starts)."""

    kind: ClassVar[str] = "bench_progress"
    stage: str  # build | flops | family | peak | warning | explore
    message: str


@dataclass(frozen=True)
class ModelFlops(Event):
    """The transformer's model FLOPs per iteration and the device's dense peaks, counted once as a run
    starts (telemetry/model_flops.py); with each iteration's phase seconds they give its MFU (telemetry/mfu.py)."""

    kind: ClassVar[str] = "model_flops"
    forward: float | None  # one sample through one denoising step; None: not counted (`note` says why)
    train_pair: float | None  # one trained (sample, timestep) pair: forward + backward, + old (+ reference) forward
    phases: dict[str, float]  # model FLOPs of one iteration, all processes together: explore, regenerate, train, total
    precisions: dict[str, str]  # the precision each phase multiplies in
    peaks: dict[str, float]  # one device's dense FLOP/s by precision; a precision missing: unmeasured
    peak_sources: dict[str, str]  # where each peak comes from, or why it is unmeasured
    devices: int  # processes, one device each, the work is spread over
    device: str  # the device the peaks are of
    note: str = ""


def event_types() -> dict[str, type[Event]]:
    """Every event class, by the kind it writes as "event"."""
    found: dict[str, type[Event]] = {}
    todo = [Event]
    while todo:
        for sub in todo.pop().__subclasses__():
            found[sub.kind] = sub
            todo.append(sub)
    return found


def decode(record: dict[str, Any]) -> Event:
    """The typed event of one `events.jsonl` record (what `Event.to_dict` wrote), keyed by its "event".

    Raises UnknownEventKind for a kind this version does not know (readers skip it, counted, and say
    so), and EventDecodeError for a record that is no dict, has no "event", or whose fields do not fit
    its kind: a name the class lacks, a required field missing, or a value of the wrong JSON type
    (readers stop there, naming the line). A field added later with a default may be absent, so
    files written before it still decode. An int where a float is declared is read as that float."""
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        raise EventDecodeError(f"not an event record (a JSON object with an \"event\" kind): {str(record)[:80]}", None)
    kind = record["event"]
    cls = event_types().get(kind)
    if cls is None:
        raise UnknownEventKind(f"unknown event kind {kind!r}", kind)
    values = {k: v for k, v in record.items() if k != "event"}
    return _build(cls, values, kind)


def _build(cls: type, values: dict[str, Any], kind: str) -> Any:
    """`cls(**values)`, each value checked against its field's annotation first."""
    names = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    stray = sorted(set(values) - set(names))
    if stray:
        raise EventDecodeError(f"event {kind!r} has no field {stray[0]!r}", kind)
    for name, value in values.items():
        values[name] = _value(names[name], value, kind, name)
    try:
        return cls(**values)
    except TypeError as exc:  # a required field missing
        raise EventDecodeError(f"event {kind!r} does not fit its fields: {exc}", kind) from exc


def _value(annotation: str, value: Any, kind: str, name: str) -> Any:
    optional = annotation.endswith(" | None")
    base = annotation.removesuffix(" | None").split("[")[0]
    if value is None and optional:
        return None
    if base == "RewardStats":
        if not isinstance(value, dict):
            raise EventDecodeError(f"event {kind!r} field {name!r} is {value!r}, not reward statistics", kind)
        return _build(RewardStats, dict(value), kind)
    if base not in JSON_TYPES:  # a new event field of a type this reader cannot check: the round-trip test says so
        raise EventDecodeError(f"event {kind!r} field {name!r} has a type the decoder does not know: {annotation}",
                               kind)
    if not isinstance(value, JSON_TYPES[base]) or (isinstance(value, bool) and base != "bool"):
        raise EventDecodeError(f"event {kind!r} field {name!r} should be {annotation}, not {shown(value)}", kind)
    if base == "float":
        if isinstance(value, int) and abs(value) > 2**1023:  # float() would overflow
            raise EventDecodeError(f"event {kind!r} field {name!r} is {shown(value)}, beyond a float", kind)
        return float(value)
    try:
        return printable_data(value)  # a record comes from a run folder: no terminal control reaches a screen
    except OverflowError as exc:
        raise EventDecodeError(f"event {kind!r} field {name!r}: {exc}", kind) from None
