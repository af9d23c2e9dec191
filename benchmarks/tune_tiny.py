"""Tune the tiny world's preset without its held-out pairs: per-kind gains of candidate settings.

Each candidate is the tiny preset (or --model) with a few `--set` overrides. It trains from the
pre-trained base with the run seed, then the base weights and the final EMA weights are scored on
--eval-prompts with --eval-seeds fixed seeds per prompt. The default, `tinyworld_validation`, holds
no held-out object pair (choosing settings on the held-out sets would make them a second training
set): every single-object caption, and binding/position captions on train pairs that the run does
not train on. Printed per candidate: the training seconds (the iterations' seconds['total'],
evaluations not counted), the mean score of each kind of prompt (object, count, binding, position)
base -> EMA with the change's paired standard error (+-), and the smallest per-kind gain among the
kinds below the ceiling, which is what "every kind rises" asks; and each eval reward's change
(run.eval_rewards: the tiny preset's tinyworld_fidelity) with its paired standard error.

    python benchmarks/tune_tiny.py --candidate default --candidate lr=optimizer.lr=5e-4
    python benchmarks/tune_tiny.py --candidate "it40_lr=run.iterations=40;optimizer.lr=4e-4" --json /tmp/tune.json
    python benchmarks/tune_tiny.py --candidate default --eval-prompts tinyworld_heldout_all   # the chosen one, once

A candidate is NAME or NAME=SECTION.KEY=VALUE[;SECTION.KEY=VALUE...]; --set applies to all of them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from _common import add_common_args  # benchmarks/ is on sys.path when a script runs

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.data.tinyworld import KINDS
from solrl_core.loop.trainer import train
from solrl_core.telemetry.peaks import device_label

REWARD = "tinyworld_geneval"
CEILING = 0.999  # a kind whose base mean is at least this cannot rise; it must not fall


def parse_candidate(text: str) -> tuple[str, list[str]]:
    name, _, sets = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"candidate {text!r} has no name: write NAME or NAME=SECTION.KEY=VALUE[;...]")
    overrides = [s.strip() for s in sets.split(";") if s.strip()]
    bad = [s for s in overrides if "=" not in s]
    if bad:
        raise argparse.ArgumentTypeError(f"candidate {name!r}: {bad[0]!r} is not SECTION.KEY=VALUE")
    return name, overrides


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, "write every candidate's result here")
    p.add_argument("--candidate", dest="candidates", action="append", type=parse_candidate, required=True,
                   metavar="NAME[=OVERRIDES]", help="a candidate setting (repeatable); overrides separated by ';'")
    p.add_argument("--eval-prompts", default="tinyworld_validation",
                   help="prompt set scored before and after (default: tinyworld_validation, no held-out pair)")
    p.add_argument("--eval-seeds", type=int, default=8, help="fixed seeds per prompt in the two evaluations (default: "
                                                             "8)")
    args = p.parse_args(argv)
    names = [n for n, _ in args.candidates]
    if len(set(names)) != len(names):
        p.error(f"candidate names repeat: {names}")
    if args.eval_seeds < 1:
        p.error("--eval-seeds must be at least 1")
    return args


def run_candidate(name: str, overrides: list[str], args: argparse.Namespace, root: Path) -> dict:
    """Train one candidate; return its settings, training seconds and per-kind base/EMA means."""
    sets = args.sets + overrides + [f"run.eval_prompts={args.eval_prompts}", f"run.eval_seeds={args.eval_seeds}",
                                    f"run.run_dir={root / name}", f"run.device={args.device}",
                                    f"run.threads={args.threads}"]
    iterations = resolve_config(model=args.model, sets=sets).run.iterations
    # evaluate only before the first iteration and after the last; one checkpoint, at the end
    cfg = resolve_config(model=args.model,
                         sets=sets + [f"run.eval_every={iterations}", f"run.checkpoint_every={iterations}"])
    clock = {"train_s": 0.0, "device": ""}
    evals: list[ev.EvalFinished] = []

    def collect(event: ev.Event) -> None:
        if isinstance(event, ev.RunStarted):
            clock["device"] = event.device
        elif isinstance(event, ev.IterationFinished):
            clock["train_s"] += event.seconds["total"]
        elif isinstance(event, ev.EvalFinished):
            evals.append(event)

    bus = ev.EventBus()
    bus.subscribe(collect)
    t0 = time.perf_counter()
    session = train(cfg, bus)
    wall = time.perf_counter() - t0
    base, last = evals[0], evals[-1]
    if base.weights != "base" or last.weights != "ema" or last.iteration != session.state.iteration:
        raise SystemExit(f"candidate {name}: expected a base evaluation first and an EMA one after the last iteration, "
                         f"got {[(e.weights, e.iteration) for e in evals]}")

    def kinds(e: ev.EvalFinished) -> dict[str, float]:
        return {k: e.extras[f"{REWARD}.{k}"] for k in KINDS if f"{REWARD}.{k}" in e.extras}

    return {"name": name, "overrides": overrides, "iterations": session.state.iteration, "train_s": clock["train_s"],
            "wall_s": wall, "device": clock["device"], "samples": base.samples,
            "base": {"mean": base.mean, **kinds(base)},
            "ema": {"mean": last.mean, **kinds(last)},
            "se": {"mean": last.delta_se.get("mean"), **{k: last.delta_se.get(f"{REWARD}.{k}") for k in kinds(last)}},
            "eval_rewards": {k: {"base": base.eval_rewards[k], "change": v, "se": last.eval_se[k]}
                             for k, v in last.eval_changes.items()}}


def worst_gain(r: dict) -> float:
    """The smallest per-kind gain among kinds below the ceiling (a kind at the ceiling counts its change, if it
    fell)."""
    gains = {k: r["ema"][k] - r["base"][k] for k in KINDS if k in r["base"]}
    below = [g for k, g in gains.items() if r["base"][k] < CEILING or g < 0]
    return min(below) if below else 0.0


def report(results: list[dict], args: argparse.Namespace) -> str:
    kinds = [k for k in KINDS if k in results[0]["base"]]
    lines = [f"device: {device_label(results[0]['device'])} | torch {torch.__version__} | threads "
             f"{torch.get_num_threads()} | model {args.model} | scored on {args.eval_prompts} x {args.eval_seeds} "
             f"seeds ({results[0]['samples']} images), base weights before training, EMA weights after the last "
             f"iteration",
             "", "| candidate | overrides | iterations | train s | " + " | ".join(kinds) + " | all | worst kind gain | "
                                                                                           "eval rewards |",
             "|---|---|---|---|" + "---|" * (len(kinds) + 3)]
    for r in results:
        cells = [f"{r['base'][k]:.3f} -> {r['ema'][k]:.3f} ({r['ema'][k] - r['base'][k]:+.3f} +- {r['se'][k]:.3f})"
                 for k in kinds]
        lines.append(f"| {r['name']} | {'; '.join(r['overrides']) or '(preset)'} | {r['iterations']} | "
                     f"{r['train_s']:.1f} | "
                     + " | ".join(cells) + f" | {r['base']['mean']:.4f} -> {r['ema']['mean']:.4f} | "
                                           f"{worst_gain(r):+.3f} | "
                     + "; ".join(f"{k} {v['change']:+.4f} +- {v['se']:.4f}" for k, v in r["eval_rewards"].items())
                     + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="solrl-tune-") as tmp:
        for name, overrides in args.candidates:
            print(f"training candidate {name} ({'; '.join(overrides) or 'preset'}) ...", flush=True)
            results.append(run_candidate(name, overrides, args, Path(tmp)))
            r = results[-1]
            gains = "  ".join(f"{k} {r['ema'][k] - r['base'][k]:+.3f}" for k in KINDS if k in r["base"])
            held = "".join(f"; {k} {v['change']:+.4f}" for k, v in r["eval_rewards"].items())
            print(f"  {name}: {r['iterations']} iterations, {r['train_s']:.1f} s trained; {gains}; worst kind gain "
                  f"{worst_gain(r):+.3f}{held}",
                  flush=True)
    print("\n" + report(results, args))
    if args.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "model": args.model,
                "eval_prompts": args.eval_prompts, "eval_seeds": args.eval_seeds, "sets": args.sets}
        args.json.write_text(json.dumps({"meta": meta, "candidates": results}, indent=2) + "\n")
        print(f"\nresults written to {args.json}")


if __name__ == "__main__":
    main()
