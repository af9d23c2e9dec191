"""Convergence by wall-clock: held-out reward against training seconds, for several families.

Every family trains the same model from the same pre-trained weights, with the same run seed,
prompts, N (explore.group_size) and K (selection.group_size), for the same budget of training
seconds: the sum of the iterations' `seconds["total"]` (explore, selection, regenerate, reward,
train, sync). Evaluations and checkpoints are not counted. A run stops after the iteration that
reaches the budget, so each family overshoots it by less than one iteration; the seconds it really
trained are printed. The EMA weights are evaluated on the held-out prompts every --eval-every
iterations (with the run's fixed evaluation seeds), before the first iteration, and once more after
the last one if that one was not already evaluated.

Printed: each family's series "train-seconds -> held-out reward (strict accuracy)", a target
held-out reward (--target, or by default the base reward plus half of the largest gain any family
reached), the train-seconds each family needed to first reach it, and sol_rl's speed-up over the
others in time to target.

    python benchmarks/convergence.py                                  # 150 s per family, tiny world
    python benchmarks/convergence.py --budget-seconds 30 --eval-every 2 --json /tmp/conv.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from _common import add_common_args, add_families_arg  # benchmarks/ is on sys.path when a script runs

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.loop.evaluation import evaluate
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.telemetry.peaks import device_label

DEFAULT_FAMILIES = ("sol_rl", "naive_scaling", "diffusionnft")
STRICT = "tinyworld_geneval.strict_accuracy"
NEVER = 10**9  # run.iterations: the budget, not the iteration count, ends a run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, "write every family's series here")
    add_families_arg(p, DEFAULT_FAMILIES)
    p.add_argument("--budget-seconds", type=float, default=150.0, help="training seconds per family (default: 150)")
    p.add_argument("--eval-every", type=int, default=5, help="run.eval_every: iterations between evaluations (default: "
                                                             "5)")
    p.add_argument("--eval-seeds", type=int, default=2, help="run.eval_seeds: seeds per held-out prompt (default: 2)")
    p.add_argument("--target", type=float, help="held-out reward to reach (default: base + half the largest gain)")
    p.add_argument("--n", type=int, help="N, explore.group_size (default: the model preset's)")
    p.add_argument("--k", type=int, help="K, selection.group_size (default: the model preset's)")
    p.add_argument("--seed", type=int, default=0, help="run.seed shared by every family (default: 0)")
    args = p.parse_args(argv)
    if args.budget_seconds <= 0:
        p.error("--budget-seconds must be positive")
    return args




def run_family(family: str, args: argparse.Namespace, root: Path) -> dict:
    """Train one family until its training seconds reach the budget; return its evaluation series."""
    sets = [f"run.iterations={NEVER}", f"run.checkpoint_every={NEVER}", f"run.eval_every={args.eval_every}",
            f"run.eval_seeds={args.eval_seeds}", f"run.seed={args.seed}", f"run.device={args.device}",
            f"run.threads={args.threads}", f"run.run_dir={root / family}"]
    sets += ([f"explore.group_size={args.n}"] * (args.n is not None) + [f"selection.group_size={args.k}"]
             * (args.k is not None))
    cfg = resolve_config(model=args.model, family=family, sets=sets + args.sets)
    if not cfg.run.eval_prompts:
        raise SystemExit(f"model preset {args.model} sets no run.eval_prompts: pass --set run.eval_prompts=<held-out "
                         f"set>")
    stop, clock = StopFlag(), {"train_s": 0.0, "iterations": 0}
    started: list[ev.RunStarted] = []
    points: list[dict] = []

    def point(iteration: int, mean: float, extras: dict[str, float]) -> None:
        points.append({"iteration": iteration, "train_s": clock["train_s"], "reward": mean,
                       "strict": extras.get(STRICT)})
        strict = f" (strict {extras[STRICT]:.3f})" if STRICT in extras else ""
        print(f"  {family} iter {iteration:>4}  train {clock['train_s']:>7.1f} s  held-out {mean:.4f}{strict}",
              flush=True)

    def collect(event: ev.Event) -> None:
        if isinstance(event, ev.RunStarted):
            started.append(event)
        elif isinstance(event, ev.IterationFinished):
            clock["train_s"] += event.seconds["total"]
            clock["iterations"] = event.iteration
            if clock["train_s"] >= args.budget_seconds:
                stop.requested = True
        elif isinstance(event, ev.EvalFinished):
            point(event.iteration, event.mean, event.extras)

    bus = ev.EventBus()
    bus.subscribe(collect)
    session = train(cfg, bus, stop=stop)
    if points[-1]["iteration"] != session.state.iteration:  # the budget ran out between two evaluations
        result = evaluate(session.run, session.run.eval_prompts, cfg.run.eval_seeds, "ema")
        point(session.state.iteration, result.mean, result.extras)
    plan = session.run.plan
    return {"family": family, "plan": started[0].plan, "device": started[0].device, "dtype": started[0].dtype,
            "n": plan.explore_seeds, "k": plan.keep, "explore_steps": plan.explore_steps, "full_steps": plan.full_steps,
            "explore_precision": plan.explore_precision, "prompts_per_iteration": cfg.run.prompts_per_iteration,
            "eval_prompts": cfg.run.eval_prompts, "eval_samples": len(session.run.eval_prompts) * cfg.run.eval_seeds,
            "train_s": clock["train_s"], "iterations": clock["iterations"], "points": points}


def time_to(points: list[dict], target: float) -> dict | None:
    return next((p for p in points if p["reward"] >= target), None)


def report(results: list[dict], args: argparse.Namespace) -> tuple[str, dict]:
    first = results[0]
    lines = [f"device: {device_label(first['device'])} | torch {torch.__version__} | threads {torch.get_num_threads()} "
             f"| dtype {first['dtype']}",
             f"budget {args.budget_seconds:g} training seconds per family (iterations' seconds['total']; evaluations "
             f"not counted) | seed {args.seed} | prompts/iter {first['prompts_per_iteration']} | eval: EMA weights, "
             f"{first['eval_prompts']}, {first['eval_samples']} samples, every {args.eval_every} iterations"]
    lines += [f"  {r['family']}: {r['plan']}" for r in results]
    bases = {r["family"]: r["points"][0]["reward"] for r in results}
    base = bases[first["family"]]
    lines += ["", "held-out reward by training seconds: train-s -> reward (strict accuracy)"]
    for r in results:
        series = ", ".join(f"{p['train_s']:.1f} -> {p['reward']:.4f}"
                           + (f" ({p['strict']:.3f})" if p["strict"] is not None else "")
                           for p in r["points"])
        best = max(p["reward"] for p in r["points"])
        lines.append(f"{r['family']} ({r['iterations']} iterations, {r['train_s']:.1f} s trained, best {best:.4f}, "
                     f"gain {best - base:+.4f}): {series}")
    if len(set(bases.values())) > 1:
        lines.append("note: the base evaluations differ between families: "
                     + ", ".join(f"{f} {b:.4f}" for f, b in bases.items()))
    gains = {r["family"]: max(p["reward"] for p in r["points"]) - base for r in results}
    top = max(gains, key=gains.get)
    summary: dict = {"base": base, "gains": gains}
    if args.target is not None:
        target = args.target
        lines += ["", f"target held-out reward {target:.4f} (--target)"]
    elif gains[top] > 0:
        target = base + gains[top] / 2
        lines += ["", f"target held-out reward {target:.4f} = base {base:.4f} + half of the largest gain "
                      f"{gains[top]:.4f} ({top})"]
    else:
        lines += ["", "no family improved on the base held-out reward: no target, no time to target"]
        return "\n".join(lines), summary
    reached = {r["family"]: time_to(r["points"], target) for r in results}
    summary.update(target=target, time_to_target={f: (p["train_s"] if p else None) for f, p in reached.items()})
    lines.append("time to target: "
                 + " | ".join(f"{f} {p['train_s']:.1f} s (iteration {p['iteration']})" if p else f"{f} not reached"
                                                 for f, p in reached.items()))
    ref = reached.get("sol_rl")
    if "sol_rl" in reached:
        parts = []
        for f, p in reached.items():
            if f == "sol_rl":
                continue
            if ref and p:
                parts.append(f"{f} / sol_rl {p['train_s'] / ref['train_s']:.2f}x" if ref["train_s"] > 0 else f"{f}: "
                                                                                                             f"sol_rl "
                                                                                                             f"reached "
                                                                                                             f"it at 0 "
                                                                                                             f"s")
            else:
                parts.append(f"{f}: not computable ({'sol_rl' if not ref else f} did not reach the target)")
        lines.append("speed-up of sol_rl in time to target: " + " | ".join(parts))
    return "\n".join(lines), summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="solrl-conv-") as tmp:
        for family in dict.fromkeys(args.families):
            print(f"training {family} for {args.budget_seconds:g} training seconds ...", flush=True)
            results.append(run_family(family, args, Path(tmp)))
    text, summary = report(results, args)
    print("\n" + text)
    if args.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
                "device": device_label(results[0]["device"]),
                "budget_seconds": args.budget_seconds, "eval_every": args.eval_every, "eval_seeds": args.eval_seeds,
                "seed": args.seed}
        args.json.write_text(json.dumps({"meta": meta, "summary": summary, "families": results}, indent=2) + "\n")
        print(f"\nseries written to {args.json}")


if __name__ == "__main__":
    main()
