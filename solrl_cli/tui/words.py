"""What every view of a run says about its events, in words: the log's lines, the warnings a run
survived, an evaluation starting, an iteration's MFU. The plain display, the TUI and the monitor's
snapshot all take their words from here. No Textual, no rich, no torch."""

from __future__ import annotations

import math

from solrl_core import events as ev
from solrl_core.telemetry.mfu import percent, phase_mfu
from solrl_core.text import plural

FAULT_EVENTS = (ev.OutOfMemoryBackoff, ev.SamplesDropped, ev.StepSkipped, ev.RewardHacking, ev.RolledBack)  # each view: warnings


def mfu_text(flops: ev.ModelFlops | None, seconds: dict[str, float]) -> str:
    """'  MFU 3.4% (explore 5.1%, regenerate 4.9%, train 2.6%)': an iteration's model FLOPs utilisation,
    as `solrl bench` computes it; '' when the run's FLOPs were not counted."""
    mfu = phase_mfu(flops, seconds)
    if not mfu:
        return ""
    return f"  MFU {percent(mfu['total'])} (" + ", ".join(f"{p} {percent(v)}" for p, v in mfu.items() if p != "total") + ")"


HACKING_THEN = {"warn": "images may be degrading; --set run.on_hacking=stop (or rollback) acts on it",
                "stop": "the run stops here with a checkpoint (run.on_hacking=stop)",
                "rollback": "the run rolls back to its last good checkpoint (run.on_hacking=rollback)"}


def fault_message(e: ev.OutOfMemoryBackoff | ev.SamplesDropped | ev.StepSkipped | ev.RewardHacking | ev.RolledBack) -> str:
    """One line for a fault the run survived (solrl_core/faults), a reward-hacking alarm or a rollback, shown as a warning by every view."""
    if isinstance(e, ev.RewardHacking):
        then = HACKING_THEN[e.action or ("stop" if e.stopping else "warn")]  # no action: an older log
        floor = f" and its floor {e.floor:.4g}" if e.floor else ""
        return (f"reward hacking? iteration {e.iteration}: the trained reward {e.trained} rose {e.trained_change:+.4f} "
                f"(+- {e.trained_se:.4f} s.e.) since the base while eval reward {e.reward} fell {e.change:+.4f} "
                f"(+- {e.se:.4f} s.e., more than {e.threshold:g} s.e.{floor}): {then}")
    if isinstance(e, ev.RolledBack):
        aside = f"; set aside: {', '.join(e.set_aside)}" if e.set_aside else ""
        then = (f"training goes on from there at lr {e.lr:g} (run.rollback_then=lower_lr)" if e.then == "lower_lr" else
                "the run stops there (run.rollback_then=stop): resume it with a change (a lower optimizer.lr), "
                "or the same fall follows")
        return (f"rolled back after iteration {e.iteration} to iteration {e.to} ({e.checkpoint}), the newest checkpoint "
                f"evaluated clean (rollback {e.rollbacks}){aside}: {then}")
    if isinstance(e, ev.OutOfMemoryBackoff):
        return (f"out of GPU memory in the {e.phase} (iteration {e.iteration}): {e.setting} {e.old} -> {e.new}, "
                "iteration redone")
    if isinstance(e, ev.SamplesDropped):
        named = ", ".join(f"'{name}' {count}" for name, count in e.rewards.items())
        explore = e.stage == "explore"
        where = "not selected" if explore else "left out of the update"
        lost = "had no finite draft" if explore else "skipped"
        groups = f"; {e.groups_skipped} of {e.groups} prompt groups {lost}" if e.groups_skipped else ""
        return f"non-finite rewards in iteration {e.iteration} ({e.stage}): {named}; {e.dropped} of {e.samples} samples {where}{groups}"
    limit = f" (the run stops at {e.limit})" if e.limit else ""
    return f"optimizer step of iteration {e.iteration} skipped: {e.reason}, {e.in_a_row} in a row{limit}"


def eval_started_text(e: ev.EvalStarted) -> str:
    when = f", after iteration {e.iteration}" if e.iteration else ""
    return f"evaluating the {e.weights} weights on {e.prompts} ({e.samples} images{when})"


def iteration_line(e: ev.IterationFinished) -> str:
    """The log's line for an iteration: its rewards, loss and seconds."""
    draft = f" (draft {e.draft.mean:.4g})" if e.draft else ""
    return (f"iteration {e.iteration}/{e.iterations}: reward {e.final.mean:.4g}{draft}, loss {e.loss.get('loss', math.nan):.4g}, "
            f"{e.seconds.get('total', 0.0):.2f}s")


def eval_line(e: ev.EvalFinished, base: ev.EvalFinished) -> str:
    """The log's line for an evaluation: its mean, and its change since the base with the paired s.e."""
    change = "" if e is base else f", {e.mean - base.mean:+.4f} since the base" + (
        f" +- {e.delta_se['mean']:.4f} s.e." if "mean" in e.delta_se else "")
    return f"evaluated the {e.weights} weights on {e.prompts} ({plural(e.samples, 'image')}): reward {e.mean:.4g}{change} ({e.seconds:.1f}s)"


# said once where a video model's clips were written as GIFs: imageio is missing (video_output.mp4_available)
GIF_NOTE = 'clips written as animated GIFs: MP4 needs the video extra (pip install "solrl[video]": imageio, imageio-ffmpeg)'


def written(e: ev.ImagesWritten) -> str:
    """'2 images', or a video model's '2 clips (MP4, with PNG contact sheets)'."""
    if not e.clips:
        return plural(e.count, "image")
    return f"{plural(e.count, 'clip')} ({e.clips.upper()}, with PNG contact sheets)"


def log_line(e: ev.Event) -> str:
    """The log panel's words for a checkpoint, rank check, calibration, compile, evaluation start, sample grid or images written;
    '' for others."""
    if isinstance(e, ev.EvalStarted):
        return f"{eval_started_text(e)} ..."
    if isinstance(e, ev.CheckpointSaved):
        return f"checkpoint iteration {e.iteration} -> {e.path} ({e.seconds:.2f}s)"
    if isinstance(e, ev.RankCheckResult):
        cor = "  ".join(f"{n} {v:.3f}" if v is not None else f"{n} - (constant)" for n, v in (("rho", e.rho), ("tau", e.tau)))
        return (f"rank check iteration {e.iteration} ({plural(e.seeds, 'seed')} of one prompt, draft vs full): {cor}"
                + ("  (full rollouts reused from the calibration)" if e.reused else ""))
    if isinstance(e, ev.CalibrationDone):
        if e.precisions:  # precision x steps
            curve = "  ".join(f"{c['name']}:{c['recall']:.2f}" for c in e.candidates)
            return (f"calibration before iteration {e.iteration} ({e.seconds:.1f}s): Stage 1 at {e.chosen}; recall by "
                    f"precision@steps {curve}; floor {e.min_recall:.3f}")
        curve = "  ".join(f"{c['steps']}:{c['recall']:.2f}" for c in e.candidates)
        return (f"calibration before iteration {e.iteration} ({e.seconds:.1f}s): Stage 1 at {e.chosen}; recall by preview "
                f"steps {curve}; floor {e.min_recall:.3f}")
    if isinstance(e, ev.CompileStarted):
        return f"compiling the {e.target} (torch.compile, once) ..."
    if isinstance(e, ev.CompileFinished):
        return f"compiled the {e.target} in {e.seconds:.1f}s (once, before the first iteration)"
    if isinstance(e, ev.SampleGrid):
        clips = f" (contact sheets; the clips: {e.video})" if e.video else ""
        return f"sample grid iteration {e.iteration} ({len(e.rewards)} Stage-2 samples of '{e.prompt[:40]}') -> {e.path}{clips}"
    if isinstance(e, ev.ImagesWritten):
        return f"{written(e)} ({e.weights} weights) -> {e.folder}"
    return ""
