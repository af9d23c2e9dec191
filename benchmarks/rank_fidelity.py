"""Ranking fidelity: does the cheap Stage-1 rollout rank a prompt's seeds like the expensive one?

On the base model (adapters off: the explore copy built at session start is the base model, since
every LoRA B starts at zero), P prompts x S seeds are rolled out by three arms and scored:

    <explore precision>@<preview steps>   the sol_rl Stage-1 explore copy (emulated NVFP4 by default)
    <full precision>@<preview steps>      the full-precision base at preview steps (step effect only)
    <full precision>@<full steps>         the full-precision base at full steps: the reference

Per prompt, each draft arm is compared with the reference: Spearman rho and Kendall tau-b (tau-b
because the reward has many ties; a prompt where either arm's rewards are constant has no defined
correlation and is counted apart, never dropped silently), the top-K and bottom-K hit rates (the
overlap of the K best, resp. worst, seeds by draft reward with those by final reward, ranked by a
stable sort so ties go by seed order, as `selection.select` does) and the mean final reward of the
best_worst selection of K (selection.group_size) chosen by the draft vs by the final reward.

    python benchmarks/rank_fidelity.py                       # 16 prompts x 32 seeds, 6 vs 10 steps
    python benchmarks/rank_fidelity.py --prompts 8 --seeds 16 --json /tmp/rank.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time

import numpy as np
import torch
from scipy import stats

from solrl_core.presets import resolve_config
from solrl_core.rollout import generate
from solrl_core.sampler import sigma_grid
from solrl_core.selection import select
from solrl_core.session import open_session
from _common import add_common_args, device_name  # benchmarks/ is on sys.path when a script runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, 'write every reward and per-prompt statistic here')
    p.add_argument("--prompt-set", default="tinyworld_train", help="prompt set; its first --prompts prompts are used")
    p.add_argument("--prompts", type=int, default=16, help="P: prompts (default: 16)")
    p.add_argument("--seeds", type=int, default=32, help="S: seeds per prompt (default: 32)")
    p.add_argument("--seed-base", type=int, default=0, help="prompt i uses seeds base + i*S ... base + i*S + S-1 (default: 0)")
    p.add_argument("--preview-steps", type=int, default=6, help="steps of the two draft arms (default: 6)")
    p.add_argument("--full-steps", type=int, default=10, help="steps of the reference arm (default: 10)")
    p.add_argument("--hit-k", type=int, nargs="+", default=[4, 8], help="K of the top/bottom-K hit rates (default: 4 8)")
    return p.parse_args(argv)




def ranked(r: np.ndarray) -> np.ndarray:
    """Indices best first; ties keep seed order (the stable sort `selection.select` uses)."""
    return torch.argsort(torch.as_tensor(r), descending=True, stable=True).numpy()


def compare(draft: np.ndarray, final: np.ndarray, hit_k: list[int], keep: int) -> dict:
    """Statistics of one prompt: draft rewards [S] against final (reference) rewards [S]."""
    constant = {"draft": bool(np.all(draft == draft[0])), "final": bool(np.all(final == final[0]))}
    defined = not (constant["draft"] or constant["final"])
    out = {"rho": float(stats.spearmanr(draft, final).statistic) if defined else None,
           "tau": float(stats.kendalltau(draft, final, variant="b").statistic) if defined else None, "constant": constant}
    d, f = ranked(draft), ranked(final)
    for k in hit_k:
        out[f"top{k}"] = len(set(d[:k]) & set(f[:k])) / k
        out[f"bottom{k}"] = len(set(d[-k:]) & set(f[-k:])) / k
    rng = np.random.default_rng(0)  # best_worst draws nothing; select() only needs one to exist
    by_draft, by_final = (select(torch.as_tensor(x), keep, "best_worst", rng).numpy() for x in (draft, final))
    h = keep // 2
    for name, idx in (("draft", by_draft), ("final", by_final)):
        out[f"sel_{name}"] = float(final[idx].mean())
        out[f"best_{name}"], out[f"worst_{name}"] = float(final[idx[:h]].mean()), float(final[idx[h:]].mean())
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.seeds < 2 * max(args.hit_k):
        raise SystemExit(f"--seeds {args.seeds} is too few for top/bottom-{max(args.hit_k)} hit rates: use at least {2 * max(args.hit_k)}")
    with tempfile.TemporaryDirectory(prefix="solrl-rank-") as tmp:
        cfg = resolve_config(args.model, "sol_rl", sets=[
            f"explore.steps={args.preview_steps}", f"sampler.steps={args.full_steps}", f"run.prompts={args.prompt_set}",
            f"run.device={args.device}", f"run.threads={args.threads}", "run.eval_prompts=", f"run.run_dir={tmp}/run", *args.sets])
        session = open_session(cfg)  # writes its run directory now and nothing later: removing it is safe
    if session.explore_copy is None:
        raise SystemExit(f"explore precision {session.plan.explore_precision} equals the full precision: there is no explore copy to measure")
    if args.prompts > len(session.prompts):
        raise SystemExit(f"--prompts {args.prompts} exceeds the {len(session.prompts)} prompts of {args.prompt_set}")
    P, S, smp = args.prompts, args.seeds, cfg.sampler
    prompts = session.prompts[:P]
    flat = [p for p in prompts for _ in range(S)]
    seeds = args.seed_base + torch.arange(P * S, dtype=torch.long)
    cond = session.conditioning(flat)
    full, low, copy_ = session.dtype_name, session.plan.explore_precision, session.explore_copy
    arms = {f"{low}@{args.preview_steps}": (lambda: contextlib.nullcontext(copy_.forward), copy_.dtype, args.preview_steps),
            f"{full}@{args.preview_steps}": (lambda: session.policy.weights("base"), session.dtype, args.preview_steps),
            f"{full}@{args.full_steps}": (lambda: session.policy.weights("base"), session.dtype, args.full_steps)}
    rewards, seconds = {}, {}
    for name, (network, dtype, steps) in arms.items():
        t0 = time.perf_counter()
        with torch.no_grad(), network() as net:
            latents = generate(session.model, net, cond, seeds, sigma_grid(steps, smp.shift), smp.rollout_batch, smp.solver, dtype)
            images = session.model.decode(latents)
        seconds[name] = time.perf_counter() - t0
        rewards[name] = session.rewards(images, flat).total.numpy().reshape(P, S)
        print(f"  rolled out {name}: {P * S} rollouts in {seconds[name]:.2f} s (generate + decode)", flush=True)
    q, f6, ref = arms
    keep = cfg.selection.group_size
    if keep > S:
        raise SystemExit(f"K={keep} (selection.group_size) is more than --seeds {S}: raise --seeds or --set selection.group_size")
    comparisons = [(q, ref), (f6, ref), (q, f6)]
    per = {f"{a} vs {b}": [compare(rewards[a][i], rewards[b][i], args.hit_k, keep) for i in range(P)] for a, b in comparisons}
    ks = args.hit_k

    print(f"\nranking fidelity on the base model ({session.model.description}), adapters off")
    print(f"device: {device_name(session.device)} | torch {torch.__version__} | threads {torch.get_num_threads()} | dtype {full}")
    print(f"P={P} prompts (first of {args.prompt_set}) x S={S} seeds | arms: {q} (explore copy), {f6}, {ref} (reference) | "
          f"reward {', '.join(cfg.reward.weights)} | hit K {', '.join(map(str, ks))} | best_worst K={keep}")
    print("rollout seconds (generate + decode): " + " | ".join(f"{n} {s:.2f}" for n, s in seconds.items()))
    hits = "".join(f" {f'top{k}':>5} {f'bot{k}':>5}" for k in ks)
    for label in list(per)[:2]:
        a, b = label.split(" vs ")
        print(f"\n{label}  (rho Spearman, tau Kendall tau-b; '-': undefined, an arm is constant; sel: mean {b} reward of the "
              f"best_worst {keep} chosen by draft / by final)")
        head = f"{'#':>2} {'prompt':<42} {'mean ' + a:>22} {'mean ' + b:>16} {'rho':>6} {'tau':>6}{hits} {'sel d':>6} {'sel f':>6}"
        print(head + "\n" + "-" * len(head))
        for i, (prompt, s) in enumerate(zip(prompts, per[label])):
            cor = " ".join(f"{s[c]:>6.3f}" if s[c] is not None else f"{'-':>6}" for c in ("rho", "tau"))
            print(f"{i:>2} {prompt[:42]:<42} {rewards[a][i].mean():>22.3f} {rewards[b][i].mean():>16.3f} {cor}" +
                  "".join(f" {s[f'top{k}']:>5.2f} {s[f'bottom{k}']:>5.2f}" for k in ks) + f" {s['sel_draft']:>6.3f} {s['sel_final']:>6.3f}")

    print("\noverall (means over prompts; rho/tau over the prompts where both arms vary)")
    summary = {}
    for label, rows in per.items():
        ok = [s for s in rows if s["rho"] is not None]
        m = {c: statistics.fmean(s[c] for s in rows) for c in rows[0] if c not in ("rho", "tau", "constant")}
        m["rho"], m["tau"] = (statistics.fmean(s[c] for s in ok) if ok else None for c in ("rho", "tau"))
        m["defined"] = len(ok)
        m["constant_draft"], m["constant_final"] = (sum(s["constant"][w] for s in rows) for w in ("draft", "final"))
        summary[label] = m
        cor = " ".join(f"{c} {m[c]:.3f}" if m[c] is not None else f"{c} -" for c in ("rho", "tau"))
        print(f"{label}: {cor} (defined on {len(ok)}/{P} prompts; constant draft {m['constant_draft']}, constant final "
              f"{m['constant_final']}) | " + " ".join(f"top{k} {m[f'top{k}']:.3f} bottom{k} {m[f'bottom{k}']:.3f}" for k in ks))
        print(f"    best_worst {keep}, mean final reward: by draft {m['sel_draft']:.3f} (best {keep // 2} {m['best_draft']:.3f}, "
              f"worst {keep // 2} {m['worst_draft']:.3f}) | by final {m['sel_final']:.3f} (best {m['best_final']:.3f}, "
              f"worst {m['worst_final']:.3f})")
    print("mean reward over all P x S rollouts: " + " | ".join(f"{n} {r.mean():.3f}" for n, r in rewards.items()))
    if args.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": device_name(session.device), "dtype": full,
                "model": session.model.description, "prompts": prompts, "seeds_per_prompt": S, "seed_base": args.seed_base,
                "selection_k": keep, "hit_k": ks, "seconds": seconds}
        data = {"meta": meta, "rewards": {n: r.tolist() for n, r in rewards.items()}, "per_prompt": per, "overall": summary}
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        print(f"\nraw rewards and statistics written to {args.json}")


if __name__ == "__main__":
    main()
