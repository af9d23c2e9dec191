"""Stage 1 at the official fixed preview steps against `explore.calibrate=steps`, from the same base.

For each run seed, the same preset trains twice from the same pre-trained weights: once with the
fixed explore.steps (the official 6), once with the preview steps chosen by calibration (before
the first iteration and every --recalibrate-every). Printed per arm, over the run seeds: Stage-1
seconds per iteration (the explore phase: generation and decoding; its draft scoring is in the
reward phase), the calibrations' seconds, Stage-1 model FLOPs per iteration (at the steps each
iteration ran), the training seconds (the iterations' totals, calibration included, evaluations
not) and the whole run's, and the held-out gain (EMA after the last iteration minus the base) in
total and per kind, each as a mean over run seeds +- its standard error over run seeds, next to the
mean of each run's own paired standard error.

    python benchmarks/calibrated_explore.py                       # tiny world, seeds 0 1 2, 30 iterations
    python benchmarks/calibrated_explore.py --seeds 0 --iterations 10 --json /tmp/cal.json
    python benchmarks/calibrated_explore.py --arms fixed auto-precision   # the explore precision chosen too
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np
from _common import add_common_args, resolved_device  # benchmarks/ is on sys.path when a script runs

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.telemetry.peaks import device_label

ARMS = {"fixed": (), "auto": ("explore.calibrate=steps",), "auto-precision": ("explore.calibrate=steps+precision",)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, "write every run's figures here")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run seeds (default: 0 1 2)")
    p.add_argument("--iterations", type=int, help="run.iterations (default: the model preset's)")
    p.add_argument("--recalibrate-every", type=int, default=10, help="explore.recalibrate_every of the auto arms "
                                                                     "(default: 10)")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=["fixed", "auto"],
                   help="arms to run (default: fixed auto; auto-precision: explore.calibrate=steps+precision)")
    return p.parse_args(argv)


def run_one(args: argparse.Namespace, arm: str, seed: int, root: Path) -> dict:
    sets = [f"run.seed={seed}", f"run.device={args.device}", f"run.threads={args.threads}",
            f"run.run_dir={root / f'{arm}{seed}'}",
            "run.image_every=0", *ARMS[arm], f"explore.recalibrate_every={args.recalibrate_every}", *args.sets]
    if args.iterations:
        sets.append(f"run.iterations={args.iterations}")
    seen: list[ev.Event] = []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    train(resolve_config(args.model, "sol_rl", sets=sets), bus, stop=StopFlag())
    its = [e for e in seen if isinstance(e, ev.IterationFinished)]
    flops = [e for e in seen if isinstance(e, ev.ModelFlops)]
    cals = [e for e in seen if isinstance(e, ev.CalibrationDone)]
    evals = [e for e in seen if isinstance(e, ev.EvalFinished)]
    base, last = evals[0], evals[-1]
    steps = _steps_per_iteration(len(its), cals, resolve_config(args.model, "sol_rl", sets=sets).explore.steps)
    per_step = flops[-1].phases["explore"] / (steps[-1] or 1)  # Stage-1 FLOPs are linear in preview steps
    kinds = {k.split(".")[-1]: (last.extras[k] - base.extras[k], last.delta_se.get(k, math.nan)) for k in base.extras}
    return {"arm": arm, "seed": seed, "iterations": len(its), "explore_steps": steps,
            "stage1_seconds": float(np.mean([e.seconds["explore"] for e in its])),
            "calibrate_seconds": float(sum(e.seconds.get("calibrate", 0.0) for e in its)),
            "stage1_flops": float(np.mean([per_step * s for s in steps])),
            "train_seconds": float(sum(e.seconds["total"] for e in its)),
            "run_seconds": float(next(e for e in seen if isinstance(e, ev.RunFinished)).seconds),
            "gain": last.mean - base.mean, "gain_se": last.delta_se.get("mean", math.nan), "kinds": kinds,
            "calibrations": [{"iteration": c.iteration, "chosen": c.chosen, "floor": c.min_recall, "seconds": c.seconds,
                              "recall": {d["name"]: d["recall"] for d in c.candidates}} for c in cals]}


def _steps_per_iteration(count: int, cals: list[ev.CalibrationDone], fixed: int) -> list[int]:
    """The preview steps each iteration ran: the latest calibration's choice before it, else the fixed."""
    chosen = {c.iteration: c.steps for c in cals}
    out, now = [], fixed
    for i in range(1, count + 1):
        now = chosen.get(i, now)
        out.append(now)
    return out


def _mean_se(values: list[float]) -> str:
    m = float(np.mean(values))
    se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan
    return f"{m:+.4f} +- {se:.4f}" if not math.isnan(se) else f"{m:+.4f}"


def summary(rows: list[dict]) -> list[str]:
    lines = []
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        kinds = sorted(mine[0]["kinds"])
        lines.append(f"{arm}: {len(mine)} run seeds, {mine[0]['iterations']} iterations each")
        lines.append(f"  preview steps by iteration (seed {mine[0]['seed']}): {mine[0]['explore_steps']}")
        if mine[0]["calibrations"]:
            lines.append(f"  chosen at each calibration (seed {mine[0]['seed']}): "
                         f"{[c['chosen'] for c in mine[0]['calibrations']]}")
        lines.append(f"  Stage 1: {np.mean([r['stage1_seconds'] for r in mine]):.3f} s/it, "
                     f"{np.mean([r['stage1_flops'] for r in mine]) / 1e9:.2f} GFLOP/it; calibration "
                     f"{np.mean([r['calibrate_seconds'] for r in mine]):.1f} s a run")
        lines.append(f"  training {np.mean([r['train_seconds'] for r in mine]):.1f} s, whole run "
                     f"{np.mean([r['run_seconds'] for r in mine]):.1f} s (means over seeds)")
        lines.append(f"  held-out gain (mean over seeds +- s.e. over seeds; mean paired s.e. of a run): total "
                     f"{_mean_se([r['gain'] for r in mine])} ({np.mean([r['gain_se'] for r in mine]):.4f})")
        for k in kinds:
            paired = [r["kinds"][k][1] for r in mine if not math.isnan(r["kinds"][k][1])]
            lines.append(f"    {k}: {_mean_se([r['kinds'][k][0] for r in mine])} "
                         f"({f'{np.mean(paired):.4f}' if paired else 'no paired s.e.'})")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for arm in args.arms:  # interleaved: a machine's slow spell falls on every arm alike
                rows.append(run_one(args, arm, seed, Path(tmp)))
                if args.json:  # after every run: a long benchmark stopped early keeps what it measured
                    args.json.write_text(json.dumps({"rows": rows}, indent=2))
                print(f"{arm} seed {seed}: gain {rows[-1]['gain']:+.4f}, Stage 1 {rows[-1]['stage1_seconds']:.3f} "
                      f"s/it, steps {sorted(set(rows[-1]['explore_steps']))}", flush=True)
    where = device_label(resolved_device(args.device))
    modes = ", ".join(f"{a}: {ARMS[a][0] if ARMS[a] else 'explore.calibrate=off'}" for a in args.arms)
    print(f"\n{' against '.join(args.arms)} ({modes}) on {where}")
    for line in summary(rows):
        print(line)
    if args.json:
        args.json.write_text(json.dumps({"device": where, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
