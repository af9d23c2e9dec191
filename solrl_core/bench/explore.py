"""`solrl bench --explore`: one denoising step per explore backend, its error against bf16, and the
explore copy's refresh cost (benchmarks/explore_step.py is a caller of this module).

The model preset's transformer is built at its published size (or tiny: build.py), random weights, in
bf16 on the device, and one transformer forward is timed at the rollout batch per backend, through
the wrappers the explore copy itself uses (precision/quantize.py; the preset's layer rule, whose
min-dim is scaled by the tiny width over the real one at tiny size, so the same layers are quantized):

    bf16             the reference
    fp8              solrl's fp8 explore copy: e4m3 GEMMs through torch._scaled_mm, row-wise scales
    fp8-e5m2-tensor  per-tensor FP8 E5M2, each tensor at its own amax, emulated (no speed-up)
    fp8-e5m2-delayed the official explore copy's recipe, TE's delayed-scaled E5M2, emulated (only when asked)
    fp8+fp8-attention fp8's GEMMs and torchao's FP8 FA3 attention (explore.fp8_attention): full-attention
                     models on compute capability 9.x with flash-attn FA3 only (only when asked)
    nvfp4-emulated   the exact NVFP4 emulation (numerics only: slower than bf16 by design)
    fp8-torchao      fp8 through torchao's Float8Tensor (PerRow dynamic activation + weight), the same layers
                     as fp8 (explore.fp8_backend=torchao; only when asked and torchao imports)
    nvfp4            real NVFP4 GEMMs (torchao's NVFP4Tensor, torch._scaled_mm on float4): compute
                     capability >= 10.0 only (only when asked)

Each backend eager and, with `compile`, torch.compile'd block by block as solrl compiles its copies
(regions.py), in the default run.compile_mode. A quantized backend's refresh (load the merged weights, re-quantize) is
timed too and
set against one prompt group's explore forwards (derived: step time x explore steps x N / batch).
Each output is compared with the bf16 output on the same inputs (relative RMS error): a check that
the kernels compute the right thing on this device, not a quality figure.

A backend this device has no kernel for is skipped with the reason (hardware.explore_precisions):
fp8 on a CPU runs only when asked (`numerics_only`), through torch's CPU reference `_scaled_mm`
(exact numerics, no speed-up). Random weights: speed only.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from solrl_core import events as ev
from solrl_core.bench.build import REAL, bench_model, build_transformer
from solrl_core.bench.flops import forward_inputs, text_tokens
from solrl_core.bench.video import VIDEO_REAL
from solrl_core.errors import SolrlError
from solrl_core.telemetry.peaks import device_label

FP8_ATTENTION = "fp8+fp8-attention"  # fp8's GEMMs and torchao's FP8 FA3 attention (explore.fp8_attention)
BACKENDS = ("bf16", "fp8", "fp8-e5m2-tensor", "nvfp4-emulated", "fp8-torchao", "nvfp4", "fp8-e5m2-delayed",
            FP8_ATTENTION)
DEFAULT_BACKENDS = BACKENDS[:4]  # the library backends (torchao) only when asked
# backend -> (explore precision, its kernel: precision/backends.py); all but bf16 are the explore copy's wrappers
PRECISION_OF = {"fp8-torchao": ("fp8", "torchao"), "nvfp4": ("nvfp4", "torchao"), FP8_ATTENTION: ("fp8", "scaled_mm")}
REFRESHED = ("fp8", "fp8-e5m2-tensor", "nvfp4-emulated", "fp8-torchao", "nvfp4", "fp8-e5m2-delayed")
WIDTH = 26  # the label column of the progress lines


@dataclass(frozen=True)
class ExploreOptions:
    """What to time. `steps` None: Stage 1's preview steps in the model preset's sol_rl plan (RunPlan.explore_steps)."""

    models: tuple[str, ...] = ("sana",)
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    size: str = "real"
    device: str = "auto"
    batch: int = 24  # the rollout batch (official: 24)
    group: int = 96  # N, seeds per prompt: for the refresh's share of one group's explore forwards
    steps: int | None = None
    warmup: int = 3
    repeats: int = 10
    compile: bool = True
    compile_mode: str | None = None  # None: run.compile_mode's default (the official mode)
    numerics_only: bool = False  # fp8 on a CPU through torch's reference kernel (as rank_fidelity.py --numerics-only)

    def check(self, device: torch.device) -> None:
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown:
            raise SolrlError(f"unknown explore backend {unknown[0]!r}", f"choose from: {', '.join(BACKENDS)}")
        if self.repeats < 1:
            raise SolrlError("no timed call: the warm-up takes them all", "use --iterations above --warmup")
        if device.type != "cuda" and self.size == "real":
            raise SolrlError(f"real sizes need a GPU (the published transformers in bf16), and this run is on {device}",
                             "use --size tiny --device cpu to run the same code on a CPU")


SIZE_DEFAULTS = {"real": {"batch": 24, "group": 96}, "tiny": {"batch": 8, "group": 8}}  # as `solrl bench`'s


def explore_options(*, model: str | None, size: str, device: str | None, n: int | None,  # noqa: PLR0913
                    batch: int | None,
                    calls: int | None, warmup: int | None, backends: list[str] | None, compile: bool,
                    numerics_only: bool, unused: dict[str, object]) -> ExploreOptions:
    """`solrl bench --explore`'s options: N and the rollout batch default by size as for the families;
    `calls` counts the warm-up calls too (default 3 warm-up + 10 timed); an option of the families'
    bench that means nothing here is refused rather than ignored."""
    given = [name for name, value in unused.items() if value]
    if given:
        raise SolrlError(f"{given[0]} does not apply to --explore (one denoising step, no training)",
                         "leave it out, or drop --explore to time the families")
    defaults = SIZE_DEFAULTS.get(size, SIZE_DEFAULTS["real"])
    warm = 3 if warmup is None else warmup
    return ExploreOptions(models=(model or "sana",), backends=tuple(backends or DEFAULT_BACKENDS), size=size,
                          device=device or "auto", batch=batch or defaults["batch"], group=n or defaults["group"],
                          warmup=warm, repeats=(calls - warm) if calls else 10, compile=compile,
                          numerics_only=numerics_only)


@dataclass
class ExploreResult:
    device: str
    torch: str
    options: dict[str, Any]
    rows: list[dict[str, Any]]  # per model and backend: a step, a refresh, or a skip with its reason

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_explore(options: ExploreOptions, bus: ev.EventBus,
                on_backend: Callable[[ExploreResult], None] | None = None) -> ExploreResult:
    """Time every backend of `options` on each model; each line is said on `bus` as it is measured.
    `on_backend`: called after each backend with the result so far (a lease writes it as it goes)."""
    from solrl_core.runtime.device import resolve_device

    device = resolve_device(options.device)
    options.check(device)
    rows: list[dict[str, Any]] = []

    def so_far(model_rows: list[dict[str, Any]]) -> None:
        if on_backend is not None:
            on_backend(ExploreResult(device_label(device), torch.__version__, dataclasses.asdict(options),
                                     rows + model_rows))

    for preset in options.models:
        rows += measure_model(preset, options, device, bus, so_far)
        if device.type == "cuda":  # the model is gone: its memory goes back before the next one
            torch.cuda.empty_cache()
    return ExploreResult(device_label(device), torch.__version__, dataclasses.asdict(options), rows)


@dataclass
class _Model:
    """One built model and what every backend of it is timed against."""

    preset: str
    net: nn.Module
    inputs: dict[str, Any]
    reference: torch.Tensor  # the bf16 output on `inputs`
    state: dict[str, torch.Tensor]  # the bf16 weights, which a refresh loads again
    options: ExploreOptions
    device: torch.device
    bus: ev.EventBus

    def say(self, line: str) -> None:
        self.bus.emit(ev.BenchProgress(stage="explore", message=line))


def measure_model(preset: str, options: ExploreOptions, device: torch.device, bus: ev.EventBus,
                  so_far: Callable[[list[dict[str, Any]]], None] = lambda rows: None) -> list[dict[str, Any]]:
    """One model, re-wrapped in place per backend (two copies of FLUX-12B would not fit); `so_far`
    gets this model's rows after each backend."""
    from solrl_core.config.presets import resolve_config
    from solrl_core.plan.plan import plan_stages
    from solrl_core.precision.quantize import unwrap_model

    cfg = resolve_config(preset, "sol_rl")
    model = bench_model(preset, cfg.model.loader, cfg.model.resolution, options.size, frames=cfg.model.frames)
    rule = layer_rule(cfg, model.transformer, options.size)
    torch.manual_seed(0)
    net = build_transformer(model, device).requires_grad_(False)
    x = forward_inputs(model, text_tokens(model.loader, cfg.model.max_sequence_length), options.batch, device)
    with torch.no_grad():
        reference = net(**x)[0].float()
    m = _Model(preset, net, x, reference, net.state_dict(), options, device, bus)  # state: the same tensors
    params = sum(p.numel() for p in net.parameters())
    count = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"
    m.say(f"\n{preset}: {count} parameters, batch {options.batch}, {options.size} config, on {device_label(device)}")
    rows: list[dict[str, Any]] = []
    for backend in options.backends:
        skip = skip_reason(backend, device, options.numerics_only, cfg.model.loader)
        if skip:
            rows.append(dict(model=preset, backend=backend, skipped=skip))
            m.say(f"  {backend:<{WIDTH}} skipped: {skip}")
            continue
        unwrap_model(net)
        try:
            what = apply_backend(net, backend, rule)
        except Exception as exc:  # noqa: BLE001 - one backend failing must not hide the others
            rows.append(dict(model=preset, backend=backend, skipped=f"failed to build: {_first_line(exc)}"))
            m.say(f"  {backend:<{WIDTH}} failed to build: {_first_line(exc)}")
            continue
        if device.type == "cpu" and backend in ("fp8", "fp8-torchao"):
            what += "; torch's CPU reference kernel: exact numerics, no speed-up"
        rows += _steps(m, backend, what)
        if backend in REFRESHED:
            rows.append(_refresh(m, backend))
        so_far(rows)
    preview = options.steps or plan_stages(cfg, "bf16", "bf16").explore_steps  # the precisions do not change the steps
    for line in summary_lines(rows, options, preview, device_label(device)):
        m.say(line)
    return rows


def _steps(m: _Model, backend: str, what: str) -> list[dict[str, Any]]:
    from solrl_core.config.schema import RunConfig
    from solrl_core.engine.regions import CompiledBlocks

    rows = []
    for compiled in ((False, True) if m.options.compile else (False,)):
        # as the explore copy compiles: block by block, in run.compile_mode (its default: the official mode),
        # an fp8 copy's GEMMs untuned (regions.NO_GEMM_AUTOTUNE)
        untuned = backend in ("fp8", "fp8-torchao", FP8_ATTENTION)
        mode = m.options.compile_mode or RunConfig().compile_mode
        fn = CompiledBlocks(m.net, mode, active=False, gemm_autotune=not untuned) if compiled else m.net
        label = backend + (" +compile" if compiled else "")
        try:
            with torch.no_grad(), attention(backend, m.device):
                seconds = time_call(lambda fn=fn: fn(**m.inputs), m.device, m.options.warmup, m.options.repeats)
                error = relative_error(fn(**m.inputs)[0], m.reference)
        except Exception as exc:  # noqa: BLE001
            rows.append(dict(model=m.preset, backend=backend, compiled=compiled, skipped=f"failed: {_first_line(exc)}"))
            m.say(f"  {label:<{WIDTH}} failed: {_first_line(exc)}")
            continue
        rows.append(dict(model=m.preset, backend=backend, compiled=compiled, seconds=seconds, rel_error=error,
                         layers=what))
        m.say(f"  {label:<{WIDTH}} {seconds * 1e3:9.2f} ms/step   error vs bf16 {100 * error:6.2f}%   ({what})")
    return rows


def attention(backend: str, device: torch.device) -> Any:
    """The attention swap `backend` times its steps under (fp8_attention.swapped), else nothing."""
    import contextlib

    from solrl_core.precision import fp8_attention

    return (fp8_attention.swapped(fp8_attention.kernel_for(device)) if backend == FP8_ATTENTION
            else contextlib.nullcontext())


def _refresh(m: _Model, backend: str) -> dict[str, Any]:
    from solrl_core.precision.quantize import requantize

    def refresh() -> None:
        m.net.load_state_dict(m.state, strict=False)
        requantize(m.net)

    seconds = time_call(refresh, m.device, 1, max(3, m.options.repeats // 3))
    m.say(f"  {backend:<{WIDTH}} refresh {seconds * 1e3:7.1f} ms (load merged weights + re-quantize)")
    return dict(model=m.preset, backend=backend, refresh_seconds=seconds)


def summary_lines(rows: list[dict[str, Any]], options: ExploreOptions, steps: int, where: str) -> list[str]:
    """Each timed step's speed-up over eager bf16, and each refresh against one prompt group's explore
    forwards at that backend's eager step time."""
    base = next((r["seconds"] for r in rows if r["backend"] == "bf16" and r.get("compiled") is False
                 and "seconds" in r), None)
    if not base:
        return []
    lines = [f"  speed-up over eager bf16 ({where}, batch {options.batch}):"]
    lines += [f"    {r['backend'] + (' +compile' if r['compiled'] else ''):<{WIDTH}} {base / r['seconds']:6.2f}x"
              for r in rows if "seconds" in r]
    for r in rows:
        step = next((s["seconds"] for s in rows if s["backend"] == r["backend"] and "seconds" in s), None)
        if "refresh_seconds" not in r or not step:
            continue
        explore = step * steps * options.group / options.batch
        lines.append(f"  {r['backend']} refresh {r['refresh_seconds'] * 1e3:.1f} ms vs one prompt group's explore "
                     f"forwards ({options.group} seeds x {steps} steps at batch {options.batch}: {explore:.2f} s, "
                     f"derived from the eager step time): {100 * r['refresh_seconds'] / explore:.1f}% per group, less "
                     f"with more groups per refresh")
    return lines


def skip_reason(backend: str, device: torch.device, numerics_only: bool, loader: str = "") -> str:
    """Why `backend` does not run on `device` for a model of `loader` ('' when it does). FP8 attention is
    timed only where its real kernel runs: the CPU emulation would time nothing worth a row."""
    from solrl_core.plan.resolve import gpu_of
    from solrl_core.precision import fp8_attention, hardware

    if backend == FP8_ATTENTION:
        if loader not in fp8_attention.FULL_ATTENTION:
            return f"model.loader={loader} has no full attention (SANA's self-attention is linear)"
        gpu = gpu_of(device)
        missing = fp8_attention.fa3_missing(gpu.capability if gpu is not None else None)
        if missing:
            return missing

    precision = PRECISION_OF.get(backend, (backend, ""))[0]
    if backend in PRECISION_OF and importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install torchao)"
    ok, why = hardware.explore_precisions(gpu_of(device)).get(precision, (False,
                                                                          "not an explore precision solrl knows"))
    if ok:
        return ""
    if device.type == "cpu" and precision == "fp8":
        if numerics_only:
            return ""
        return f"{why}; --numerics-only runs it through torch's CPU reference kernel (exact numerics, no speed-up)"
    return why


def layer_rule(cfg: Any, transformer: dict[str, Any], size: str) -> Any:
    """The model preset's rule; at tiny size its min-dim scaled to the tiny width."""
    from solrl_core.precision.quantize import LayerRule

    rule = LayerRule.of(cfg.model)
    if size == "real":
        return rule
    wan = VIDEO_REAL.get(cfg.model.name, VIDEO_REAL["wan21_t2v_1_3b"])  # a Wan preset not recorded: Wan 2.1's width
    published = wan if cfg.model.loader == "wan" else REAL[cfg.model.loader]
    ratio = hidden_width(transformer) / hidden_width(published)
    return dataclasses.replace(rule, min_dim=round(rule.min_dim * ratio))


def hidden_width(config: dict[str, Any]) -> int:
    return config["num_attention_heads"] * config["attention_head_dim"]


def apply_backend(net: nn.Module, backend: str, rule: Any) -> str:
    """Turn `net` (bf16, unwrapped) into `backend` in place; a one-line description of what changed."""
    from solrl_core.precision.backends import wrappers_for
    from solrl_core.precision.quantize import quantize_model

    if backend == "bf16":
        return "bf16 weights and GEMMs"
    precision, kernel = PRECISION_OF.get(backend, (backend, ""))
    wrappers = wrappers_for(precision, kernel) if kernel else None
    return quantize_model(net, rule, precision, wrappers).summary() + (f" ({kernel})" if kernel else "")


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of `fn` over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """||out - reference|| / ||reference||, in fp32."""
    return float((out.float() - reference).norm() / reference.norm().clamp(min=1e-12))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
