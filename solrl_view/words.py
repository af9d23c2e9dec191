"""What every view of a run says about its events, in words: the log's lines, an evaluation
starting, an iteration's MFU (the warnings a run survived are the core's: solrl_core/fault_text.py).
The plain display, the TUI and the monitor's snapshot all take their words from here. No Textual,
no rich, no torch."""

from __future__ import annotations

import math

from solrl_core import events as ev
from solrl_core.telemetry.mfu import percent, phase_mfu
from solrl_core.text import plural


def mfu_text(flops: ev.ModelFlops | None, seconds: dict[str, float]) -> str:
    """'  MFU 3.4% (explore 5.1%, regenerate 4.9%, train 2.6%)': an iteration's model FLOPs utilisation,
    as `solrl bench` computes it; '' when the run's FLOPs were not counted."""
    mfu = phase_mfu(flops, seconds)
    if not mfu:
        return ""
    return f"  MFU {percent(mfu['total'])} (" + ", ".join(f"{p} {percent(v)}" for p, v in mfu.items() if p
                                                          != "total") + ")"


def eval_started_text(e: ev.EvalStarted) -> str:
    when = f", after iteration {e.iteration}" if e.iteration else ""
    return f"evaluating the {e.weights} weights on {e.prompts} ({e.samples} images{when})"


def iteration_line(e: ev.IterationFinished) -> str:
    """The log's line for an iteration: its rewards, loss and seconds."""
    draft = f" (draft {e.draft.mean:.4g})" if e.draft else ""
    return (f"iteration {e.iteration}/{e.iterations}: reward {e.final.mean:.4g}{draft}, loss "
            f"{e.loss.get('loss', math.nan):.4g}, {e.seconds.get('total', 0.0):.2f}s")


def eval_line(e: ev.EvalFinished, base: ev.EvalFinished) -> str:
    """The log's line for an evaluation: its mean, and its change since the base with the paired s.e."""
    change = "" if e is base else f", {e.mean - base.mean:+.4f} since the base" + (
        f" +- {e.delta_se['mean']:.4f} s.e." if "mean" in e.delta_se else "")
    return (f"evaluated the {e.weights} weights on {e.prompts} ({plural(e.samples, 'image')}): reward "
            f"{e.mean:.4g}{change} ({e.seconds:.1f}s)")


# said once where a video model's clips were written as GIFs: imageio is missing (video_output.mp4_available)
GIF_NOTE = ('clips written as animated GIFs: MP4 needs the video extra (pip install "solrl[video]": imageio, '
            'imageio-ffmpeg)')


def written(e: ev.ImagesWritten) -> str:
    """'2 images', or a video model's '2 clips (MP4, with PNG contact sheets)'."""
    if not e.clips:
        return plural(e.count, "image")
    return f"{plural(e.count, 'clip')} ({e.clips.upper()}, with PNG contact sheets)"


def log_line(e: ev.Event) -> str:
    """The log panel's words for a checkpoint, rank check, calibration, compile, evaluation start, sample grid or images
    written;
    '' for others."""
    if isinstance(e, ev.EvalStarted):
        return f"{eval_started_text(e)} ..."
    if isinstance(e, ev.CheckpointSaved):
        return f"checkpoint iteration {e.iteration} -> {e.path} ({e.seconds:.2f}s)"
    if isinstance(e, ev.RankCheckResult):
        cor = "  ".join(f"{n} {v:.3f}" if v is not None else f"{n} - (constant)"
                        for n, v in (("rho", e.rho), ("tau", e.tau)))
        return (f"rank check iteration {e.iteration} ({plural(e.seeds, 'seed')} of one prompt, draft vs full): {cor}"
                + ("  (full rollouts reused from the calibration)" if e.reused else ""))
    if isinstance(e, ev.CalibrationDone):
        if e.precisions:  # precision x steps
            curve = "  ".join(f"{c['name']}:{c['recall']:.2f}" for c in e.candidates)
            return (f"calibration before iteration {e.iteration} ({e.seconds:.1f}s): Stage 1 at {e.chosen}; recall by "
                    f"precision@steps {curve}; floor {e.min_recall:.3f}")
        curve = "  ".join(f"{c['steps']}:{c['recall']:.2f}" for c in e.candidates)
        return (f"calibration before iteration {e.iteration} ({e.seconds:.1f}s): Stage 1 at {e.chosen}; recall by "
                f"preview steps {curve}; floor {e.min_recall:.3f}")
    if isinstance(e, ev.CompileStarted):
        return f"compiling the {e.target} (torch.compile, once) ..."
    if isinstance(e, ev.CompileFinished):
        return f"compiled the {e.target} in {e.seconds:.1f}s (once, before the first iteration)"
    if isinstance(e, ev.SampleGrid):
        clips = f" (contact sheets; the clips: {e.video})" if e.video else ""
        return (f"sample grid iteration {e.iteration} ({len(e.rewards)} Stage-2 samples of '{e.prompt[:40]}') -> "
                f"{e.path}{clips}")
    if isinstance(e, ev.ImagesWritten):
        return f"{written(e)} ({e.weights} weights) -> {e.folder}"
    return ""
