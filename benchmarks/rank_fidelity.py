"""Ranking fidelity: does the cheap Stage-1 rollout rank a prompt's seeds like the expensive one?

The engine's rank check (`solrl_core/loop/rankcheck.py`, also `solrl rank-check`) on the base model: P
prompts x S seeds through four arms, explore precision x {preview, full} steps and full precision x
{preview, full} steps, each compared per prompt with the full-precision full-step reference
(Spearman rho, Kendall tau-b, top/bottom-K hit rates, reward gap of the best_worst selection). This
script prints the per-prompt rows as well as the overall table, plus the machine it ran on.

    python benchmarks/rank_fidelity.py                       # 16 prompts x 32 seeds, 6 vs 10 steps
    python benchmarks/rank_fidelity.py --prompts 8 --seeds 16 --json /tmp/rank.json
    python benchmarks/rank_fidelity.py --set explore.precision=fp8 --numerics-only   # fp8 ranking on a CPU
"""

from __future__ import annotations

import argparse
import json

import torch
from _common import add_common_args  # benchmarks/ is on sys.path when a script runs

from solrl_core.config.presets import resolve_config
from solrl_core.data.prompts import load_prompts
from solrl_core.engine.engine import open_engine
from solrl_core.loop.rankcheck import check
from solrl_core.rewards import RewardSet
from solrl_core.runtime.device import resolve_device
from solrl_core.telemetry.peaks import device_label


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, "write every reward and per-prompt statistic here")
    p.add_argument("--prompt-set", default="tinyworld_train", help="prompt set; its first --prompts prompts are used")
    p.add_argument("--prompts", type=int, default=16, help="P: prompts (default: 16)")
    p.add_argument("--seeds", type=int, default=32, help="S: seeds per prompt (default: 32)")
    p.add_argument("--seed-base", type=int, default=0, help="prompt i uses seeds base + i*S ... base + i*S + S-1 "
                                                            "(default: 0)")
    p.add_argument("--preview-steps", type=int, default=6, help="steps of the preview arms (default: 6)")
    p.add_argument("--full-steps", type=int, default=10, help="steps of the full arms (default: 10)")
    p.add_argument("--numerics-only", action="store_true",
                   help="run an explore precision this machine has no fast kernel for through torch's reference "
                        "kernels (--set explore.precision=fp8 on a CPU): its ranking, not its speed")
    p.add_argument("--hit-k", type=int, nargs="+", default=[4, 8],
                   help="K of the top/bottom-K hit rates (default: 4 8)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.seeds < 2 * max(args.hit_k):
        raise SystemExit(f"--seeds {args.seeds} is too few for top/bottom-{max(args.hit_k)} hit rates: use at least "
                         f"{2 * max(args.hit_k)}")
    cfg = resolve_config(args.model, "sol_rl", sets=[
        f"explore.steps={args.preview_steps}", f"sampler.steps={args.full_steps}", f"run.device={args.device}",
        f"run.threads={args.threads}", *args.sets])
    prompts = load_prompts(args.prompt_set)[:args.prompts]
    keep = min(cfg.selection.group_size, args.seeds)
    rewards = RewardSet.from_config(cfg.reward, resolve_device(cfg.run.device))
    engine = open_engine(cfg, explore=True, numerics_only=args.numerics_only, rewards=rewards)
    result = check(engine, prompts, args.seeds, seed_base=args.seed_base, preview_steps=args.preview_steps,
                   full_steps=args.full_steps, hit_k=args.hit_k, keep=keep,
                   progress=lambda arm,
                   s: print(f"  {arm}: {len(prompts) * args.seeds} rollouts scored in {s:.2f} s", flush=True))
    ks, ref = args.hit_k, result.arms[-1]

    print(f"\nranking fidelity on the base model ({engine.model.description}), adapters off")
    print(f"device: {device_label(engine.device)} | torch {torch.__version__} | threads {torch.get_num_threads()} | "
          f"dtype {engine.dtype_name}")
    print(f"P={len(prompts)} prompts (first of {args.prompt_set}) x S={args.seeds} seeds | reference {ref} | "
          f"reward {', '.join(cfg.reward.weights)} | hit K {', '.join(map(str, ks))} | best_worst K={keep}")
    hits = "".join(f" {f'top{k}':>5} {f'bot{k}':>5}" for k in ks)
    for arm in result.arms[:-1]:
        print(f"\n{arm} vs {ref}  (rho Spearman, tau Kendall tau-b; '-': undefined, an arm is constant; gap: {ref} "
              f"reward of the best {keep // 2} minus the worst {keep // 2} chosen by {arm} / by {ref})")
        head = (f"{'#':>2} {'prompt':<42} {'mean arm':>9} {'mean ref':>9} {'rho':>6} {'tau':>6}{hits} {'gap a':>6} "
                f"{'gap r':>6}")
        print(head + "\n" + "-" * len(head))
        for i, (prompt, s) in enumerate(zip(prompts, result.per_prompt[arm], strict=True)):
            cor = " ".join(f"{s[c]:>6.3f}" if s[c] is not None else f"{'-':>6}" for c in ("rho", "tau"))
            print(f"{i:>2} {prompt[:42]:<42} {result.rewards[arm][i].mean():>9.3f} "
                  f"{result.rewards[ref][i].mean():>9.3f} {cor}" +
                  "".join(f" {s[f'top{k}']:>5.2f} {s[f'bottom{k}']:>5.2f}" for k in ks) + f" {s['gap_draft']:>6.3f} "
                                                                                          f"{s['gap_final']:>6.3f}")

    print("\noverall (means over prompts; rho/tau over the prompts where both arms vary)")
    for arm, m in result.overall.items():
        cor = " ".join(f"{c} {m[c]:.3f}" if m[c] is not None else f"{c} -" for c in ("rho", "tau"))
        print(f"{arm} vs {ref}: {cor} (defined on {m['defined']}/{m['prompts']} prompts) | "
              + " ".join(f"top{k} {m[f'top{k}']:.3f} bottom{k} {m[f'bottom{k}']:.3f}" for k in ks)
              + f" | best_worst {keep} reward gap in {ref}: chosen by arm {m['gap_draft']:.3f}, by {ref} "
                f"{m['gap_final']:.3f}")
    print("mean reward over all P x S rollouts: "
          + " | ".join(f"{n} {r.mean():.3f}" for n, r in result.rewards.items()))
    print("seconds per arm (generate + decode + reward): "
          + " | ".join(f"{n} {s:.2f}" for n, s in result.seconds.items()))
    if args.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": device_label(engine.device),
                "dtype": engine.dtype_name, "model": engine.model.description}
        args.json.write_text(json.dumps({"meta": meta, **result.to_dict()}, indent=2) + "\n")
        print(f"\nraw rewards and statistics written to {args.json}")


if __name__ == "__main__":
    main()
