"""`solrl bench`: each family trained for a few iterations through `solrl train`'s own code on a
random-weight model of the preset's published size, the warm-up iterations dropped.

Per family and phase: seconds (the median of the measured iterations, with their spread, min to
max: two noisy iterations make no figure), throughput, peak memory (with the
doctor's estimate beside it at real size), the one-time compile times, model FLOPs (flops.py), model
FLOPs utilisation against the device's dense peak at the precision each phase multiplies in
(telemetry/peaks.py), and each family's total and rollout (explore + regenerate) time against the `compile`
family, the compiled bf16 baseline: the ratio of the medians, and the range the iterations allow
(slowest against fastest each way), which says whether 1.0x is inside it. One prompt group per iteration, a cheap JPEG
reward on the CPU.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from solrl_core import events as ev
from solrl_core.bench.build import bench_model, build_pipeline, parameters, parts
from solrl_core.bench.flops import count_sample_flops, text_tokens
from solrl_core.errors import SolrlError
from solrl_core.telemetry import peaks as pk
from solrl_core.telemetry.mfu import format_flops, lifted
from solrl_core.telemetry.model_flops import SampleFlops, phase_flops, phase_precisions

FAMILIES = ("sol_rl", "compile", "naive_scaling")
PHASES = ("explore", "regenerate", "reward", "train", "sync", "total")
MEMORY_PHASES = ("explore", "regenerate", "train", "sync", "total")
MODEL_PHASES = ("explore", "regenerate", "train")  # the phases that run the transformer
REWARD = "jpeg_compressibility"  # cheap and on the CPU: the bench times the model, not a reward network
# --reward-model: the reward each choice trains on ("pickscore": a random-weight network of
# PickScore_v1's architecture, CLIP ViT-H/14, scoring on the run's device as a real reward would)
REWARD_MODELS = {"jpeg": REWARD, "pickscore": "pickscore"}
# N, K and the rollout batch when not given: the official ones at real size, a few seeds at tiny size (a CPU)
SIZE_DEFAULTS = {"real": {"n": 96, "k": 24, "rollout_batch": 24}, "tiny": {"n": 8, "k": 4, "rollout_batch": 8}}


@dataclass(frozen=True)
class BenchOptions:
    """What to measure. `micro_batch` None keeps the model preset's optimizer.micro_batch."""

    model: str = "sana"
    families: tuple[str, ...] = FAMILIES
    size: str = "real"
    device: str = "auto"
    n: int | None = None  # None: SIZE_DEFAULTS
    k: int | None = None
    micro_batch: int | None = None
    rollout_batch: int | None = None
    iterations: int = 6  # warm-up included: the figures are medians of the others, with their spread
    warmup: int = 1
    sets: tuple[str, ...] = field(default=())
    check_memory: bool = True  # at real size: refuse before building when the doctor's estimate does not fit (fits.py)
    # sol_rl: also the calibration table (precision x steps) on the trained engine, and the iteration's
    # time derived at the setting explore.calibrate=steps+precision picks (auto_explore)
    auto_explore: bool = False
    real_vae: bool = False  # the published VAE architecture at the preset's resolution (build.PUBLISHED_VAES)
    reward_model: str = "jpeg"  # REWARD_MODELS

    def resolved(self) -> "BenchOptions":
        """N, K and the rollout batch filled in for the size where not given."""
        given = {k: v for k, v in SIZE_DEFAULTS.get(self.size, SIZE_DEFAULTS["real"]).items()
                 if getattr(self, k) is None}
        return dataclasses.replace(self, **given)

    def check(self, device: torch.device) -> None:
        if self.iterations <= self.warmup:
            raise SolrlError(f"--iterations {self.iterations} leaves nothing after {self.warmup} warm-up iteration(s)",
                             f"use --iterations {self.warmup + 2} or more")
        if self.reward_model not in REWARD_MODELS:
            raise SolrlError(f"--reward-model {self.reward_model}: expected one of {', '.join(REWARD_MODELS)}",
                             "use --reward-model jpeg (on the CPU) or pickscore (a reward network of the real size)")
        if device.type != "cuda" and self.size == "real":
            raise SolrlError(f"--size real builds the published model (billions of parameters): it needs a GPU, and "
                             f"this run is on {device}", "use --size tiny --device cpu to run the same code on a CPU")


@dataclass
class BenchResult:
    device: str
    torch: str
    options: dict[str, Any]
    model: dict[str, Any]  # preset, size, parameters, resolution, text tokens, FLOPs per sample
    rows: list[dict[str, Any]]  # one per family

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_bench(options: BenchOptions, bus: ev.EventBus, workdir: Path | None = None,
              on_family: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Build the model once, train each family on it, and measure; events on `bus` say what runs.
    `on_family`: called after each family with the result so far (its figures, ratios once `compile`
    is in), so a caller can write what is measured before a later family runs out of time."""
    from solrl_core.config.presets import resolve_config
    from solrl_core.runtime.device import resolve_device

    options = options.resolved()
    base = resolve_config(options.model, "sol_rl", REWARD, sets=options.sets)
    # a model it builds, first
    model = bench_model(options.model, base.model.loader, base.model.resolution, options.size,
                        options.real_vae, base.model.frames)
    device = resolve_device(options.device)
    options.check(device)
    tokens = text_tokens(model.loader, base.model.max_sequence_length)
    count = parameters(model)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        root = Path(tmp)
        if options.size == "real" and options.check_memory and device.type == "cuda":
            from solrl_core.bench.fits import check_fits
            from solrl_core.plan.resolve import gpu_of

            check_fits({f: family_config(options, f, root) for f in options.families}, device, gpu_of(device))
        bus.emit(ev.BenchProgress(stage="build", message=(
            f"building the {options.model} transformer at {options.size} size ({_count(count)} parameters, random "
            f"weights), {parts(model)}, on {device}")))
        folder = _build(model, root / "pipeline", device, count)
        if options.reward_model == "pickscore":
            from solrl_core.bench.encoders import save_clip_reward

            bus.emit(ev.BenchProgress(stage="build", message=f"building a random-weight reward network of "
                                      f"PickScore_v1's architecture "
                                      f"({'CLIP ViT-H/14' if options.size == 'real' else 'one layer'}), on {device}"))
            save_clip_reward(root / "reward", options.size, device, torch.bfloat16)
        per_sample = count_sample_flops(model, tokens)
        how = ("forward derived from the config (wan_forward_flops), forward + backward FlopCounterMode on the meta "
               "device"
               if model.loader == "wan" else "FlopCounterMode, meta device")
        bus.emit(ev.BenchProgress(stage="flops", message=(
            f"model FLOPs per sample ({how}): forward {format_flops(per_sample.forward)}, "
            f"forward + backward {format_flops(per_sample.forward_backward)}")))
        rows: list[dict[str, Any]] = []
        cache: dict[tuple[str, str], pk.Peak | None] = {}
        for family in options.families:
            rows.append(_run_family(options, family, folder, model.resolution, per_sample, bus, root))
            if on_family is not None:
                on_family(_result(options, device, model, count, tokens, per_sample, rows, cache=cache, bus=bus))
    return _result(options, device, model, count, tokens, per_sample, rows, cache=cache, bus=bus)


def _result(options: BenchOptions, device: torch.device, model: Any, count: int, tokens: int, per_sample: SampleFlops,
            rows: list[dict[str, Any]], *, cache: dict, bus: ev.EventBus) -> BenchResult:
    """The result of the families run so far: peaks (measured once per precision, into `cache`), MFU, ratios."""
    for row in rows:
        _add_peaks(row, device, cache, bus)
    add_utilisation(rows)
    add_ratios(rows)
    info = {"preset": options.model, "loader": model.loader, "size": options.size, "parameters": count,
            "resolution": model.resolution, "latent_side": model.latent_side, "frames": model.frames,
            "text_tokens": tokens,
            "vae": "published" if model.real_vae else ("small Wan" if model.loader == "wan" else "two-block"),
            "reward": REWARD_MODELS[options.reward_model],
            "flops_per_sample": dataclasses.asdict(per_sample), "transformer_config": model.transformer}
    return BenchResult(pk.device_label(device), torch.__version__, dataclasses.asdict(options), info, rows)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _build(model: Any, folder: Path, device: torch.device, count: int) -> Path:
    try:
        return build_pipeline(model, folder, device)
    except torch.cuda.OutOfMemoryError as exc:
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        raise SolrlError(f"the {model.preset} transformer ({count / 1e9:.1f}B parameters, {count * 2 / 2**30:.1f} GiB "
                         f"in bf16) does not fit in the {total:.0f} GiB of {pk.device_label(device)}",
                         "use a GPU with more memory, a smaller --model, or --size tiny to run the code path") from exc


FIXES = {"rollout": "lower --rollout-batch or --n (explore.group_size)",
         "update": "lower --micro-batch or --k (selection.group_size)",
         "reward": "lower --rollout-batch", "evaluation": "lower --rollout-batch"}


def _train(cfg: Any, bus: ev.EventBus, family: str) -> Any:
    """`solrl train` on `cfg`; running out of memory is said with the bench's own settings to lower."""
    from solrl_core.loop.backoff import DoesNotFit
    from solrl_core.loop.trainer import StopFlag, train

    try:
        return train(cfg, bus, stop=StopFlag())
    except DoesNotFit as exc:
        phase = next((p for p in FIXES if f"in the {p} " in exc.message), "update")
        raise SolrlError(f"{family} does not fit here: {exc.message}",
                         FIXES[phase] + ", or use a GPU with more memory") from exc
    except torch.cuda.OutOfMemoryError as exc:
        raise SolrlError(f"{family}: out of GPU memory while loading the model and its copies",
                         "use a GPU with more memory or a smaller --model; an fp8 explore copy (--set "
                         "explore.precision=fp8) is smaller than the emulated NVFP4 one") from exc


def _run_family(options: BenchOptions, family: str, folder: Path, resolution: int, per_sample: SampleFlops,
                bus: ev.EventBus, root: Path) -> dict[str, Any]:
    from solrl_core.plan.footprint import estimate_memory

    cfg = family_config(options, family, root, folder, resolution)
    bus.emit(ev.BenchProgress(stage="family", message=(
        f"{family}: {options.iterations} iterations, the first {options.warmup} dropped as warm-up")))
    seen: list[ev.Event] = []
    graphs: list[int] = []  # Dynamo's count of graphs compiled so far, read as each iteration ends
    relay = ev.EventBus()
    relay.subscribe(seen.append)
    relay.subscribe(lambda e: graphs.append(compiled_graphs()) if isinstance(e, ev.IterationFinished) else None)
    relay.subscribe(bus.emit)
    session = _train(cfg, relay, family)
    run, machine = session.run, session.run.machine
    its = [e for e in seen if isinstance(e, ev.IterationFinished)][options.warmup:]
    if not its:
        raise SolrlError(f"{family} stopped before a measured iteration", "let it run to the end (no stop during a "
                                                                          "bench)")
    started = next(e for e in seen if isinstance(e, ev.RunStarted))
    # the doctor's estimate is of the preset's real model: only a real size compares
    estimate = estimate_memory(run.config, machine.explore_precision, run.engine.dtype_name, machine.checkpointing,
                               machine.rollout_copy, machine.update_compile).peak if options.size == "real" else None
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    figures = phase_seconds(its)
    seconds = figures["seconds"]
    flops = phase_flops(run.plan, run.config, per_sample, run.config.run.prompts_per_iteration)
    auto = auto_explore(run, seconds, bus) if options.auto_explore and family == "sol_rl" else None
    return {"auto_explore": auto, "model": options.model, "family": family, "plan": started.plan,
            "machine": started.machine,
            "compile_mode": run.config.run.compile_mode,
            **figures, "rates": _rates(run.plan, run.config, seconds),
            "peak_gib": {k: max((e.peak_memory or {}).get(k, 0.0) for e in its) for k in MEMORY_PHASES},
            "memory_source": its[-1].memory_source, "estimate_gib": estimate,
            "compile_seconds": {e.target: e.seconds for e in seen if isinstance(e, ev.CompileFinished)},
            "backoffs": [f"{e.setting} {e.old} -> {e.new} ({e.phase})" for e in seen
                         if isinstance(e, ev.OutOfMemoryBackoff)],
            "iterations_measured": len(its), "flops": flops, "precision": phase_precisions(run.plan),
            # graphs Dynamo compiled during the measured iterations: any is a recompile after warm-up
            "graphs_after_warmup": graphs[-1] - graphs[options.warmup - 1] if options.warmup else None}


def phase_seconds(its: list[ev.IterationFinished]) -> dict[str, Any]:
    """Per phase, of the measured iterations: the median seconds ('seconds'), each one's ('seconds_each')
    and their spread, [fastest, slowest] ('spread')."""
    each = {k: [e.seconds.get(k, 0.0) for e in its] for k in PHASES}
    return {"seconds": {k: statistics.median(v) for k, v in each.items()}, "seconds_each": each,
            "spread": {k: [min(v), max(v)] for k, v in each.items()}}


def family_config(options: BenchOptions, family: str, root: Path, folder: Path | None = None,
                  resolution: int | None = None) -> Any:
    """The config `family` trains with in the bench; without `folder` (not built yet) the preset's own
    model, which is what the doctor's memory estimate is of."""
    from solrl_core.config.presets import resolve_config

    model = [f"model.path={folder}", f"model.resolution={resolution}"] if folder is not None else []
    # the built-in prompts: a random-weight model needs no download (the real-model presets name PickScore's)
    sets = [*model, "run.prompts=general", f"explore.group_size={options.n}", f"selection.group_size={options.k}",
            "run.prompts_per_iteration=1",
            f"run.iterations={options.iterations}", f"run.checkpoint_every={options.iterations}",
            f"run.device={options.device}",
            f"run.run_dir={root / family}", "run.eval_prompts=", f"sampler.rollout_batch={options.rollout_batch}",
            *([f"optimizer.micro_batch={options.micro_batch}"] if options.micro_batch else []), *options.sets]
    if options.reward_model == "pickscore" and folder is not None:
        sets.append(f"reward.paths.pickscore={root / 'reward'}")
    return resolve_config(options.model, family, REWARD_MODELS[options.reward_model], sets=sets)


def _rates(plan: Any, cfg: Any, seconds: dict[str, float]) -> dict[str, float | None]:
    """Work per second: sample-steps (one sample through one denoising step) in the rollouts,
    (sample, timestep) training pairs in the update, trained images per iteration second in total."""
    prompts = cfg.run.prompts_per_iteration
    pairs = prompts * plan.keep * min(max(1, int(plan.full_steps * cfg.algorithm.timestep_fraction)), plan.full_steps)
    work = {"explore": prompts * plan.explore_seeds * plan.explore_steps,
            "regenerate": prompts * plan.keep * plan.full_steps if plan.regenerate else 0,
            "train": pairs, "total": prompts * plan.keep}
    return {k: (v / seconds[k] if v and seconds[k] > 0 else None) for k, v in work.items()}


def _add_peaks(row: dict[str, Any], device: torch.device, cache: dict, bus: ev.EventBus) -> None:
    """The device's dense peak at each phase's precision (measured once per precision, into `cache`)."""
    row["peak_flops"] = {}
    for phase in MODEL_PHASES:
        precision = row["precision"][phase]
        if (str(device), precision) not in cache and device.type != "cuda":
            bus.emit(ev.BenchProgress(stage="peak", message=f"measuring {precision} GEMM throughput on "
                                                            f"{pk.device_label(device)}"))
        peak = pk.device_peak(device, precision, cache)
        row["peak_flops"][phase] = peak.to_dict() if peak else None


def add_utilisation(rows: list[dict[str, Any]]) -> None:
    """Model FLOPs utilisation per phase: FLOPs / seconds / the device's dense peak at the phase's
    precision, a measured peak lifted to the fastest rate any phase of any family reached at it
    (mfu.lifted: never above 100%, and the same peak for every row); in total, the time the
    iteration's work takes at peak over the time it took."""
    rates: dict[str, list[float]] = {}
    for row in rows:
        for phase in MODEL_PHASES:
            if row["peak_flops"][phase] and row["flops"][phase] and row["seconds"][phase] > 0:
                rates.setdefault(row["precision"][phase], []).append(row["flops"][phase] / row["seconds"][phase])
    for row in rows:
        row["mfu"], at_peak = {}, 0.0
        for phase in MODEL_PHASES:
            peak, seconds, flops = row["peak_flops"][phase], row["seconds"][phase], row["flops"][phase]
            if peak is None or not flops or seconds <= 0:
                row["mfu"][phase] = None
                continue
            measured = peak["tflops"] * 1e12
            rate = lifted(measured, peak["source"], rates[row["precision"][phase]])
            if rate > measured:
                row["peak_flops"][phase] = {**peak, "tflops": rate / 1e12, "source": f"{peak['source']}, lifted to the "
                                            "fastest phase's own rate (a measurement under load reads low)"}
            row["mfu"][phase] = flops / seconds / rate
            at_peak += flops / rate
        known = all(row["mfu"][p] is not None for p in MODEL_PHASES if row["flops"][p])
        row["mfu"]["total"] = at_peak / row["seconds"]["total"] if known and row["seconds"]["total"] > 0 else None


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each family's speed-up over the `compile` family of the same model: total iteration time and
    rollout time (explore + regenerate), as the ratio of the medians; None without a compile row.
    With the iterations' seconds ('seconds_each'), also the range the ratio may take ('total_range',
    'rollout_range': compile's fastest over this family's slowest, to its slowest over this one's fastest)."""
    for row in rows:
        base = next((r for r in rows if r["family"] == "compile" and r["model"] == row["model"]), None)
        if base is None or base is row:
            row["vs_compile"] = None
            continue
        mine, theirs = rollout_seconds(row), rollout_seconds(base)
        ratios = {"total": base["seconds"]["total"] / row["seconds"]["total"],
                  "rollout": theirs / mine if mine > 0 else None}
        if "seconds_each" in row and "seconds_each" in base:
            ratios["total_range"] = _range(base["seconds_each"]["total"], row["seconds_each"]["total"])
            ratios["rollout_range"] = _range(_rollouts(base), _rollouts(row))
        row["vs_compile"] = ratios


def _range(theirs: list[float], mine: list[float]) -> list[float] | None:
    """[lowest, highest] of their seconds over mine, any iteration against any; None where mine has a zero."""
    return [min(theirs) / max(mine), max(theirs) / min(mine)] if min(mine) > 0 else None


def _rollouts(row: dict[str, Any]) -> list[float]:
    each = row["seconds_each"]
    return [a + b for a, b in zip(each["explore"], each["regenerate"])]


def rollout_seconds(row: dict[str, Any]) -> float:
    """The median iteration's explore plus the median's regenerate (each phase's median)."""
    return row["seconds"]["explore"] + row["seconds"]["regenerate"]


def compiled_graphs() -> int:
    """How many graphs torch.compile has compiled in this process (Dynamo's own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def auto_explore(run: Any, seconds: dict[str, float], bus: ev.EventBus) -> dict[str, Any]:
    """The calibration explore.calibrate=steps+precision would make on the benched sol_rl run's engine
    (its weights as the bench left them, the next iteration's first prompt groups and their Stage-1
    seeds, every low precision this machine runs), and what an iteration would take at its choice:
    DERIVED, not measured: the measured median iteration with Stage 1's generation and decoding
    scaled by the chosen candidate's measured seconds over the fixed setting's (generate, decode and
    reward of the calibration's samples), the calibration itself left out."""
    from solrl_core.loop.calibration import calibrate_engine, calibration_inputs
    from solrl_core.precision.hardware import runnable_low_precisions

    cfg = run.config
    bus.emit(ev.BenchProgress(stage="calibrate",
                              message="sol_rl: the precision x steps calibration on the benched run"))
    prompts, seeds = calibration_inputs(run, cfg.run.iterations)
    found = calibrate_engine(run.engine, prompts, seeds, keep=run.plan.keep, fixed_steps=run.plan.explore_steps,
                             min_recall=cfg.explore.min_recall, precisions=runnable_low_precisions(run.device),
                             whole_curve=False)
    fixed = next(m for m in found.candidates if m.name == found.fixed)
    ratio = found.chosen.cost / fixed.cost if fixed.cost > 0 else 1.0
    explore = seconds["explore"] * ratio
    return {"candidates": found.to_dict(), "chosen": found.chosen.name, "fixed": found.fixed, "why": found.why,
            "min_recall": found.min_recall, "calibration_seconds": found.seconds, "time_ratio": ratio,
            "derived_seconds": {"explore": explore, "total": seconds["total"] - seconds["explore"] + explore}}
