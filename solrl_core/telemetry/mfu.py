"""Model FLOPs utilisation of one iteration, from its phase seconds and the run's `ModelFlops` event:
the figure `solrl bench` prints (a phase's model FLOPs / its seconds / the dense peak at the phase's
precision), per iteration, for the terminal, the TUI and `solrl monitor`. Plain arithmetic on event
fields: no torch here, so the monitor starts fast."""

from __future__ import annotations

from typing import Any

MODEL_PHASES = ("explore", "regenerate", "train")  # the phases that run the transformer


def lifted(peak: float, source: str, rates: list[float]) -> float:
    """The peak an MFU divides by, so that none tops 100%: a measured peak raised to the fastest rate the
    model's own work reached at its precision. A GEMM measured once, for under a second, on a busy
    machine is only a lower bound of what the device does (a regenerate phase once read 108.8% against
    one); measuring again would cost as long and could land low again, while the phase's rate is proof
    of what the device reached. A datasheet peak is the vendor's ceiling and stays as it is."""
    return max([peak, *rates]) if source.startswith("measured") else peak


def phase_mfu(flops: Any, seconds: dict[str, float]) -> dict[str, float | None]:
    """MFU per phase that ran the transformer (None where its peak is unmeasured), and in total the
    time the iteration's work takes at those peaks over the time it took (None when a phase's peak
    is unmeasured). `flops` is an events.ModelFlops; the FLOPs are of all processes together, so the
    peak is one device's times `flops.devices`. Empty when the FLOPs were not counted."""
    if flops is None or flops.forward is None:
        return {}
    out: dict[str, float | None] = {}
    at_peak, known = 0.0, True
    rates: dict[str, list[float]] = {}
    for phase in MODEL_PHASES:
        work, took = flops.phases.get(phase, 0.0), seconds.get(phase, 0.0)
        if work and took > 0:
            rates.setdefault(flops.precisions.get(phase, ""), []).append(work / took / flops.devices)
    for phase in MODEL_PHASES:
        work, took = flops.phases.get(phase, 0.0), seconds.get(phase, 0.0)
        if not work:
            continue  # the phase did not run (no regeneration in this family)
        precision = flops.precisions.get(phase, "")
        peak = flops.peaks.get(precision)
        peak = peak and lifted(peak, flops.peak_sources.get(precision, ""), rates.get(precision, []))
        if not peak or took <= 0:
            out[phase], known = None, False
            continue
        out[phase] = work / took / (peak * flops.devices)
        at_peak += work / (peak * flops.devices)
    total = seconds.get("total", 0.0)
    out["total"] = at_peak / total if known and at_peak and total > 0 else None
    return out


def percent(value: float | None) -> str:
    """'12.3%', or 'unmeasured' for a phase whose peak is not known."""
    return "unmeasured" if value is None else f"{100 * value:.1f}%"


def format_flops(value: float | None) -> str:
    """1.98 GFLOP, 2.97 TFLOP, 4.5 PFLOP; "-" for none."""
    if not value:
        return "-"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e6:.3g} MFLOP"


def describe(flops: Any) -> list[str]:
    """The start-up lines: FLOPs per sample-step and per trained pair, per iteration phase, and each
    peak with where it comes from (or why it is unmeasured)."""
    if flops.forward is None:
        return [f"model FLOPs: not counted ({flops.note}); no MFU for this run"]
    phases = ", ".join(f"{p} {format_flops(flops.phases.get(p))}" for p in MODEL_PHASES if flops.phases.get(p))
    spread = f" over {flops.devices} processes" if flops.devices > 1 else ""
    lines = [f"model FLOPs (FlopCounterMode, meta device): {format_flops(flops.forward)} a sample-step, "
             f"{format_flops(flops.train_pair)} a trained pair; an iteration: {phases}{spread}"]
    for precision in sorted(set(flops.precisions.values())):
        peak = flops.peaks.get(precision)
        figure = f"{peak / 1e12:.4g} TFLOP/s" if peak else "unmeasured"
        lines.append(f"peak {precision}: {figure} ({flops.peak_sources.get(precision, '')}) on {flops.device}")
    return lines
