"""Does the cheap Stage-1 rollout rank a prompt's seeds like the expensive one? Measured, not assumed.

The same (prompt, seed) pairs go through four arms, so the effect of the low precision and the
effect of fewer steps are separated:

    <explore precision>@<preview steps>   what sol_rl's Stage 1 really runs
    <explore precision>@<full steps>      quantization alone
    <full precision>@<preview steps>      fewer steps alone
    <full precision>@<full steps>         the reference Stage 2 would give

Per prompt, each arm is compared with the reference by the measures the calibration shares
(fidelity.py): Spearman rho, Kendall tau-b, top-K and bottom-K hit rates and the reward gap of the
best_worst selection. This module is the `solrl rank-check` side: the arms, the verdict, the files.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from solrl_core.loop.fidelity import Arm, RankCheck, ranked, run_arms
from solrl_core.text import plural

if TYPE_CHECKING:
    from solrl_core.engine.engine import Engine

WITHOUT_FP8_ATTENTION = "explore-without-fp8-attention"  # an arm's network: the explore copy, its own attention


def check(engine: Engine, prompts: list[str], per_prompt: int, *, seed_base: int, preview_steps: int, full_steps: int,
          hit_k: list[int], keep: int, progress: Callable[[str, float], None] | None = None) -> RankCheck:
    """The four arms on `engine`'s explore network (its explore copy) and its full-precision rollout
    network (as training's Stage 2), seeds seed_base + i*S ... for prompt i, scored with its rewards;
    six when the copy runs FP8 attention: its two arms with it, then the four without it."""
    if engine.explore_copy is None or engine.rewards is None:
        raise ValueError("rank-check needs an engine opened with its explore copy and rewards "
                         "(open_engine(explore=True, rewards=...))")
    flat = [p for p in prompts for _ in range(per_prompt)]
    seeds = seed_base + torch.arange(len(prompts) * per_prompt, dtype=torch.long)
    copy_, full = engine.explore_copy, engine.dtype_name
    low = copy_.precision
    arms = [Arm(f"{low}@{preview_steps}", "explore", preview_steps), Arm(f"{low}@{full_steps}", "explore", full_steps),
            Arm(f"{full}@{preview_steps}", "rollout", preview_steps),
            Arm(f"{full}@{full_steps}", "rollout", full_steps)]
    if copy_.fp8_attention:  # both with and without it, on the same copy: attention's own share of the rank cost
        arms = [Arm(f"{low}+fp8-attention@{steps}", "explore", steps) for steps in (preview_steps, full_steps)] + [
            replace(arm, network=WITHOUT_FP8_ATTENTION) if arm.network == "explore" else arm for arm in arms]

    def images(on: str, steps: int) -> torch.Tensor:
        if on != WITHOUT_FP8_ATTENTION:
            return engine.images(flat, seeds, steps, on)
        with copy_.without_fp8_attention():
            return engine.images(flat, seeds, steps, "explore")

    return run_arms(arms, images, lambda x: engine.rewards(x, flat).total, prompts,
                    seeds.view(len(prompts), per_prompt),
                    hit_k, keep, progress)


def verdict(result: RankCheck) -> str:
    """One line: which Stage-1 arm to use on this machine and why, from what was measured. The default
    arm (the explore precision at the preview steps, the first) against full precision at the same steps:
    the better ranking (the reference-reward gap between the best and worst it selects; rho beside it)
    and the shorter time decide; a split is said as the trade it is."""
    arms = [a for a in result.arms[:-1] if a in result.overall]
    low, steps = arms[0], arms[0].rpartition("@")[2]
    full = next((a for a in arms if a.endswith(f"@{steps}") and a.startswith(result.arms[-1].partition("@")[0])), None)
    if full is None:
        return f"keep {low}: no full-precision arm at {steps} steps to weigh it against"
    g_low, g_full = result.overall[low]["gap_draft"], result.overall[full]["gap_draft"]
    s_low, s_full = result.seconds[low], result.seconds[full]
    r_low, r_full = (result.overall[a]["rho"] for a in (low, full))
    rho = f"rho {'-' if r_low is None else f'{r_low:.2f}'} vs {'-' if r_full is None else f'{r_full:.2f}'}"
    facts = f"{low} vs {full}: gap {g_low:.3f} vs {g_full:.3f}, {rho}, {s_low:.1f}s vs {s_full:.1f}s"
    precision = full.partition("@")[0]
    if g_full >= g_low and s_full <= s_low:
        return f"use --explore-precision {precision} on this machine: it ranks as well or better in less time ({facts})"
    if g_low >= g_full and s_low <= s_full:
        return f"keep {low.partition('@')[0]}: it ranks as well or better in less time than {precision} ({facts})"
    if s_low < s_full:
        return (f"keep {low.partition('@')[0]} for speed ({s_low:.1f}s vs {s_full:.1f}s); --explore-precision "
                f"{precision} ranks better here ({facts})")
    return (f"use --explore-precision {precision} for speed ({s_full:.1f}s vs {s_low:.1f}s); {low.partition('@')[0]} "
            f"ranks better here ({facts})")


def check_to_folder(engine: Engine, prompts: list[str], out_dir: Path, *, per_prompt: int, seed_base: int,
                    hit_k: list[int], keep: int, progress: Callable[[str, float], None] | None = None) -> RankCheck:
    """`check` at the config's preview and full step counts, written to `out_dir`: rank_check.json
    (the result, with the device, model, checkpoint and rewards it ran with) and rank_check.png."""
    import json

    from solrl_core.io.atomic import write_atomic

    cfg = engine.config
    result = check(engine, prompts, per_prompt, seed_base=seed_base, preview_steps=cfg.explore.steps,
                   full_steps=cfg.sampler.steps, hit_k=hit_k, keep=keep, progress=progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"device": str(engine.device), "model": engine.model.description,
            "checkpoint": str(engine.checkpoint) if engine.checkpoint else None, "rewards": cfg.reward.weights}
    write_atomic(out_dir / "rank_check.json", json.dumps({"meta": meta, **result.to_dict()}, indent=2))
    rank_check_figure(result, out_dir / "rank_check.png",
                      f"{engine.model.description} | {plural(len(prompts), 'prompt')} x {plural(per_prompt, 'seed')} | "
                      f"{engine.device}")
    return result


def rank_check_figure(result: RankCheck, path: Path, title: str) -> Path:
    """Left: each arm's reward against the reference's, per (prompt, seed). Right: top-K and
    bottom-K hit rate against K, averaged over prompts, for every K from 1 to S/2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference = result.arms[-1]
    ref = result.rewards[reference]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8))
    for arm in result.arms[:-1]:
        left.scatter(result.rewards[arm].ravel(), ref.ravel(), s=8, alpha=0.5, label=arm)
    lo, hi = float(min(ref.min(), *(result.rewards[a].min() for a in result.arms))), float(max(ref.max(),
            *(result.rewards[a].max() for a in result.arms)))
    left.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
    left.set_xlabel("draft reward (arm)")
    left.set_ylabel(f"reference reward ({reference})")
    left.legend(fontsize=8)
    seeds = ref.shape[1]
    ks = np.arange(1, seeds // 2 + 1)
    for arm in result.arms[:-1]:
        draft = result.rewards[arm]
        top, bottom = [], []
        for k in ks:
            t = b = 0.0
            for i in range(ref.shape[0]):
                d, f = ranked(draft[i]), ranked(ref[i])
                t += len(set(d[:k]) & set(f[:k])) / k
                b += len(set(d[-k:]) & set(f[-k:])) / k
            top.append(t / ref.shape[0])
            bottom.append(b / ref.shape[0])
        line = right.plot(ks, top, label=f"{arm} top-K")[0]
        right.plot(ks, bottom, linestyle="--", color=line.get_color(), label=f"{arm} bottom-K")
    right.plot(ks, ks / seeds, color="grey", linewidth=0.8, label="chance (K/S)")
    right.set_xlabel("K")
    right.set_ylabel("hit rate vs reference")
    right.set_ylim(0, 1.02)
    right.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
