"""The paper's comparison at small scale: each loss (algorithm.loss) with Sol-RL's low-precision explore
(the sol_rl family) and without it (diffusionnft: the K seeds at full precision, no explore), on the tiny
world, each at several run seeds.

Both families roll out the same full-precision samples per iteration (K a prompt, run.prompts_per_iteration
prompts) for the same iterations; sol_rl adds its N low-precision preview drafts per prompt to choose them.
Every run is the tiny preset with only the loss and the family changed: the same learning rate, KL weight
(algorithm.kl_beta, which each loss applies to its own KL) and train timesteps; a run's figures are
frontier.py's (held-out gain and each kind's at the evaluation `--best` names, tinyworld_fidelity's change,
grain, the iterations' seconds and the load).

Resumable, as frontier.py: each finished run is written at once to --results, and a run of the same config
and seed already there, or in --reuse (frontier.py's results: its `default` point is sol_rl with nft), is
not run again.

    python benchmarks/losses.py                                        # 3 losses x 2 families x seeds 0 1 2
    python benchmarks/losses.py --losses flow_grpo --families sol_rl --seeds 0
    python benchmarks/losses.py --report-only
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _common import add_device_arg  # benchmarks/ is on sys.path when a script runs
from frontier import (DOCS, config_digest, find_run, load_results, report, run_key, save_results, summarise, sweep,
                      train_point)

LOSSES = {"nft": [], "awm": ["algorithm.loss=awm"], "flow_grpo": ["algorithm.loss=flow_grpo"]}
FAMILIES = ("sol_rl", "diffusionnft")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="model preset (default: tiny, the pre-trained tiny world)")
    add_device_arg(p)
    p.add_argument("--threads", type=int, default=0, help="run.threads (0 = auto: one per usable core)")
    p.add_argument("--losses", nargs="+", choices=list(LOSSES), default=list(LOSSES), help="losses (default: all)")
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                   help="with Sol-RL's explore (sol_rl) and without (diffusionnft) (default: both)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="run seeds (default: 0 1 2)")
    p.add_argument("--iterations", type=int, help="run.iterations of every run (default: the preset's)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="an override for every run (repeatable)")
    p.add_argument("--results", type=Path, default=DOCS / "losses_results.json", help="the resumable results file")
    p.add_argument("--reuse", type=Path, default=DOCS / "frontier_results.json",
                   help="frontier.py's results: a run of the same config and seed there is taken, not rerun")
    p.add_argument("--table", type=Path, help="also write the table (markdown) here")
    p.add_argument("--report-only", action="store_true", help="train nothing: the table from --results")
    args = p.parse_args(argv)
    args.common = [*([f"run.iterations={args.iterations}"] if args.iterations else []), *args.sets]
    return args


def _take_over(args: argparse.Namespace, points: list[tuple[str, list[str]]], digest: Any) -> None:
    """Copy into --results the runs of --reuse that trained a point's config at one of the seeds."""
    if not args.reuse.is_file():
        return
    source, data, taken = load_results(args.reuse), load_results(args.results), 0
    for name, own in points:
        config = digest([*args.common, *own])
        for seed in args.seeds:
            found = find_run(source, name, config, seed)
            if found is not None and find_run(data, name, config, seed) is None:
                data["runs"][run_key(name, config, seed)] = {**found, "point": name, "from": str(args.reuse)}
                taken += 1
    if taken:
        save_results(args.results, data)
        print(f"{taken} run(s) taken from {args.reuse}")


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    rows = []
    for family in args.families:
        digest = config_digest(args.model, family)
        points = [(f"{family}/{loss}", LOSSES[loss]) for loss in args.losses]
        if args.report_only:
            data = load_results(args.results)
        else:
            _take_over(args, points, digest)
            trainer = train_point(argparse.Namespace(model=args.model, device=args.device, threads=args.threads,
                                                     family=family))
            data = sweep(points, args.seeds, args.common, args.results, trainer, digest)
        rows += summarise(data, points, args.seeds, args.common, digest)
    if not rows:
        print(f"no finished run of these losses, families and seeds in {args.results}")
        return rows
    report(rows, args.seeds, args.results, args.table, first_column="family/loss")
    return rows


if __name__ == "__main__":
    main()
