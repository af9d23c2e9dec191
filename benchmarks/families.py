"""Phase timings of the training families on one model, measured in one process.

Every family trains the same model at the same N (explore.group_size), K (selection.group_size),
seed and prompts for a few iterations; the first `--warmup` iterations of each are dropped (one-off
costs: allocator warm-up, first quantization, lazy imports). Printed: a header saying what was
measured, a table of mean seconds per iteration for each phase with the rollouts each family
generates per iteration (counted from the resolved stage plan), and each family's total and rollout
(explore + regenerate) time relative to sol_rl.

    python benchmarks/families.py --iterations 6 --warmup 1 --n 16 --k 8 --prompts-per-iteration 4 \\
        --families sol_rl naive_scaling diffusionnft
    python benchmarks/families.py --model tiny_video --families compile sol_rl   # the tiny moving world (video)

The `compile` family is accepted but not in the default list: on a CPU its compile time dominates.
Checkpoint saving happens outside the timed iterations and is not measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from _common import add_common_args, add_families_arg  # benchmarks/ is on sys.path when a script runs

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.loop.trainer import train
from solrl_core.telemetry.peaks import device_label

DEFAULT_FAMILIES = ("sol_rl", "naive_scaling", "diffusionnft")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, 'write the raw per-iteration timings here')
    add_families_arg(p, DEFAULT_FAMILIES)
    p.add_argument("--iterations", type=int, default=6, help="iterations per family, warm-up included (default: 6)")
    p.add_argument("--warmup", type=int, default=1, help="leading iterations of each family left out of the means "
                                                         "(default: 1)")
    p.add_argument("--n", type=int, default=16, help="N: seeds explored per prompt, explore.group_size (default: 16)")
    p.add_argument("--k", type=int, default=8, help="K: seeds kept per prompt, selection.group_size (default: 8)")
    p.add_argument("--prompts-per-iteration", type=int, default=4, help="prompt groups per iteration (default: 4)")
    p.add_argument("--seed", type=int, default=0, help="run seed shared by every family (default: 0)")
    args = p.parse_args(argv)
    if args.warmup < 0 or args.iterations <= args.warmup:
        p.error(f"--iterations ({args.iterations}) must exceed --warmup ({args.warmup}) so something is measured")
    return args


def run_family(family: str, args: argparse.Namespace, root: Path) -> dict:
    """Train one family in a fresh run directory; return its plan and per-iteration timings."""
    sets = [f"explore.group_size={args.n}", f"selection.group_size={args.k}",
            f"run.prompts_per_iteration={args.prompts_per_iteration}", f"run.iterations={args.iterations}",
            f"run.checkpoint_every={args.iterations}", f"run.seed={args.seed}", f"run.device={args.device}",
            f"run.threads={args.threads}", f"run.run_dir={root / family}", *args.sets]
    cfg = resolve_config(model=args.model, family=family, reward=None, sets=sets)
    started: list[ev.RunStarted] = []
    flops: dict[str, float] = {}
    iterations: list[dict] = []

    def collect(event: ev.Event) -> None:
        if isinstance(event, ev.RunStarted):
            started.append(event)
        elif isinstance(event, ev.ModelFlops):
            flops.update(event.phases)
        elif isinstance(event, ev.IterationFinished):
            iterations.append({"iteration": event.iteration, "seconds": dict(event.seconds),
                               "final_mean": event.final.mean,
                               "draft_mean": event.draft.mean if event.draft else None})
            print(f"  {family} iteration {event.iteration}/{event.iterations}: {event.seconds['total']:.2f} s",
                  flush=True)

    bus = ev.EventBus()  # one bus per run: train() subscribes its JSONL log to the bus it is given
    bus.subscribe(collect)
    session = train(cfg, bus)
    plan, prompts = session.run.plan, cfg.run.prompts_per_iteration
    return {"family": family, "plan": started[0].plan, "explore_precision": started[0].explore_precision,
            "device": started[0].device, "dtype": started[0].dtype, "explore_steps": plan.explore_steps,
            "full_steps": plan.full_steps, "config_explore_steps": cfg.explore.steps,
            "rollouts": {"explore": prompts * plan.explore_seeds,
                         "regenerate": prompts * plan.keep if plan.regenerate else 0},
            "trained": prompts * plan.keep, "flops": flops, "iterations": iterations}




def means(result: dict, warmup: int) -> dict[str, float]:
    kept = result["iterations"][warmup:]
    return {ph: statistics.fmean(it["seconds"][ph] for it in kept) for ph in ev.PHASES}


def report(results: list[dict], args: argparse.Namespace) -> str:
    first = results[0]
    measured = args.iterations - args.warmup
    lines = [f"device: {device_label(first['device'])} | torch {torch.__version__} | threads {torch.get_num_threads()} "
             f"| dtype {first['dtype']}",
             f"N={args.n} K={args.k} prompts/iter={args.prompts_per_iteration} | "
             f"explore steps {first['config_explore_steps']} | full steps {first['full_steps']} | "
             f"explore precision: " + ", ".join(f"{r['family']}={r['explore_precision']}" for r in results) +
             f" | iterations measured {measured} per family (of {args.iterations}, first {args.warmup} dropped)"]
    for r in results:
        lines.append(f"  {r['family']}: {r['plan']}")
    head = f"{'family':<14} " + " ".join(f"{ph:>10}"
            for ph in ev.PHASES) + f" {'min/max total':>14} {'steps':>6} {'explore#':>9} {'regen#':>7}"
    lines += ["", "mean seconds per iteration", head, "-" * len(head)]
    table = {r["family"]: means(r, args.warmup) for r in results}
    for r in results:
        m, totals = table[r["family"]], [it["seconds"]["total"] for it in r["iterations"][args.warmup:]]
        lines.append(f"{r['family']:<14} " + " ".join(f"{m[ph]:>10.3f}" for ph in ev.PHASES) +
                     f" {f'{min(totals):.2f}/{max(totals):.2f}':>14} {r['explore_steps']:>6} "
                     f"{r['rollouts']['explore']:>9} {r['rollouts']['regenerate']:>7}")
    lines += ["", "model FLOPs per iteration (counted on the meta device as the run starts: telemetry/model_flops.py)",
              f"{'family':<14} {'Stage 1':>12} {'regenerate':>12} {'train':>12} {'total':>12}"]
    for r in results:
        f = r["flops"]
        lines.append(f"{r['family']:<14} " + " ".join(f"{f[ph] / 1e9:>8.1f} GFLOP" if ph in f else f"{'-':>12}"
                                                     for ph in ("explore", "regenerate", "train", "total")))
    lines += ["(min/max total: spread over the measured iterations; a wide one means other load on the machine)",
              "(steps: Stage-1 sampling steps; explore#/regen#: rollouts generated per iteration in Stage 1 / Stage 2)"]
    ref = "sol_rl" if "sol_rl" in table else results[0]["family"]
    rollout = {f: m["explore"] + m["regenerate"] for f, m in table.items()}
    lines += ["", f"relative to {ref}"]
    for f, m in table.items():
        if f == ref:
            continue
        lines.append(f"{f} / {ref} total: {m['total'] / table[ref]['total']:.2f}x | "
                     f"rollout (explore+regenerate): {rollout[f] / rollout[ref]:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="solrl-bench-") as tmp:
        for family in dict.fromkeys(args.families):  # a repeated name would reuse its run directory
            print(f"training {family} for {args.iterations} iterations ...", flush=True)
            results.append(run_family(family, args, Path(tmp)))
    print()
    print(report(results, args))
    if args.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "n": args.n, "k": args.k,
                "prompts_per_iteration": args.prompts_per_iteration, "seed": args.seed, "warmup": args.warmup,
                "iterations": args.iterations, "device": device_label(results[0]["device"])}
        args.json.write_text(json.dumps({"meta": meta, "families": results}, indent=2) + "\n")
        print(f"\nraw timings written to {args.json}")


if __name__ == "__main__":
    main()
