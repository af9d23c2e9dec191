"""Does the cheap Stage-1 rollout rank a prompt's seeds like the expensive one? Measured, not assumed.

The same (prompt, seed) pairs go through four arms, so the effect of the low precision and the
effect of fewer steps are separated:

    <explore precision>@<preview steps>   what sol_rl's Stage 1 really runs
    <explore precision>@<full steps>      quantization alone
    <full precision>@<preview steps>      fewer steps alone
    <full precision>@<full steps>         the reference Stage 2 would give

Per prompt, each arm is compared with the reference: Spearman rho, Kendall tau-b (tau-b because a
reward may tie; a prompt where either arm is constant has no defined correlation and is counted
apart, never dropped silently), top-K and bottom-K hit rates (overlap of the K best, resp. worst,
seeds by the arm's reward with those by the reference, ranked by a stable sort as
`selection.select` ranks), and the reward gap of the best_worst selection: the reference reward of
the K/2 seeds the arm calls best minus that of the K/2 it calls worst, next to the same gap when the
reference selects (the largest possible). The training signal is that contrast.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from solrl_core.loop.selection import select
from solrl_core.text import plural

if TYPE_CHECKING:
    from solrl_core.engine.engine import Engine


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=float)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rho (Pearson correlation of average ranks); None if either side is constant."""
    ra, rb = average_ranks(np.asarray(a, float)), average_ranks(np.asarray(b, float))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return None if denom == 0 else float((ra * rb).sum() / denom)


def kendall_tau_b(a: np.ndarray, b: np.ndarray) -> float | None:
    """Kendall's tau-b over all pairs (O(n^2), fine for groups of a few hundred); None if constant."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), k=1)
    sa, sb = da[upper], db[upper]
    concordant_minus_discordant = float((sa * sb).sum())
    n_a, n_b = float((sa != 0).sum()), float((sb != 0).sum())
    return None if n_a == 0 or n_b == 0 else concordant_minus_discordant / np.sqrt(n_a * n_b)


def ranked(r: np.ndarray) -> np.ndarray:
    """Indices best first; ties keep seed order (the stable sort `selection.select` uses)."""
    return torch.argsort(torch.as_tensor(r), descending=True, stable=True).numpy()


def compare(draft: np.ndarray, final: np.ndarray, hit_k: list[int], keep: int) -> dict:
    """Statistics of one prompt: an arm's rewards [S] against the reference rewards [S]."""
    constant = {"draft": bool(np.all(draft == draft[0])), "final": bool(np.all(final == final[0]))}
    out: dict = {"rho": spearman(draft, final), "tau": kendall_tau_b(draft, final), "constant": constant}
    d, f = ranked(draft), ranked(final)
    for k in hit_k:
        out[f"top{k}"] = len(set(d[:k]) & set(f[:k])) / k
        out[f"bottom{k}"] = len(set(d[-k:]) & set(f[-k:])) / k
    rng = np.random.default_rng(0)  # best_worst draws nothing; select() only needs one to exist
    by_draft, by_final = (select(torch.as_tensor(x), keep, "best_worst", rng).numpy() for x in (draft, final))
    half = keep // 2
    for name, idx in (("draft", by_draft), ("final", by_final)):  # reference rewards of what each side selects
        out[f"gap_{name}"] = float(final[idx[:half]].mean() - final[idx[half:]].mean())
    return out


def summarize(rows: list[dict]) -> dict:
    """Means over prompts; rho and tau over the prompts where both arms vary."""
    ok = [r for r in rows if r["rho"] is not None]
    m = {c: float(np.mean([r[c] for r in rows])) for c in rows[0] if c not in ("rho", "tau", "constant")}
    m["rho"] = float(np.mean([r["rho"] for r in ok])) if ok else None
    m["tau"] = float(np.mean([r["tau"] for r in ok])) if ok else None
    m["defined"] = len(ok)
    m["prompts"] = len(rows)
    m["constant_arm"] = sum(r["constant"]["draft"] for r in rows)
    m["constant_reference"] = sum(r["constant"]["final"] for r in rows)
    return m


WITHOUT_FP8_ATTENTION = "explore-without-fp8-attention"  # an arm's network: the explore copy, its own attention


@dataclass(frozen=True)
class Arm:
    name: str
    network: str  # the engine's network it rolls out on: explore or rollout (engine.py)
    steps: int


@dataclass(frozen=True)
class RankCheck:
    arms: list[str]  # the reference last
    prompts: list[str]
    seeds: torch.Tensor  # [P, S]
    rewards: dict[str, np.ndarray]  # arm -> [P, S] total reward
    per_prompt: dict[str, list[dict]]  # arm -> one compare() per prompt, against the reference
    overall: dict[str, dict]  # arm -> summarize()
    seconds: dict[str, float]  # arm -> generate + decode + reward seconds
    hit_k: list[int]
    keep: int

    def to_dict(self) -> dict:
        return {"arms": self.arms, "prompts": self.prompts, "seeds": self.seeds.tolist(), "hit_k": self.hit_k,
                "keep": self.keep, "seconds": self.seconds, "rewards": {k: v.tolist() for k, v in self.rewards.items()},
                "per_prompt": self.per_prompt, "overall": self.overall}


def run_arms(arms: list[Arm], generate_images: Callable[[str, int], torch.Tensor],
             score: Callable[[torch.Tensor], torch.Tensor], prompts: list[str], seeds: torch.Tensor, hit_k: list[int],
             keep: int, progress: Callable[[str, float], None] | None = None) -> RankCheck:
    """Roll every arm out on the same seeds, score, and compare each arm with the last (reference)."""
    P, S = seeds.shape
    rewards, seconds = {}, {}
    for arm in arms:
        rewards[arm.name], seconds[arm.name] = roll_arm(arm, generate_images, score, (P, S))
        if progress:
            progress(arm.name, seconds[arm.name])
    return compare_arms(arms, rewards, seconds, prompts, seeds, hit_k, keep)


def roll_arm(arm: Arm, generate_images: Callable[[str, int], torch.Tensor], score: Callable[[torch.Tensor], torch.Tensor],
             shape: tuple[int, int]) -> tuple[np.ndarray, float]:
    """One arm's rewards [P, S] and its generate + decode + reward seconds."""
    t0 = time.perf_counter()
    images = generate_images(arm.network, arm.steps)
    rewards = score(images).float().numpy().reshape(shape)
    return rewards, time.perf_counter() - t0


def compare_arms(arms: list[Arm], rewards: dict[str, np.ndarray], seconds: dict[str, float], prompts: list[str],
                 seeds: torch.Tensor, hit_k: list[int], keep: int) -> RankCheck:
    """Each arm's rewards compared with the last (reference) arm's, prompt by prompt."""
    P = seeds.shape[0]
    reference = arms[-1].name
    per = {a.name: [compare(rewards[a.name][i], rewards[reference][i], hit_k, keep) for i in range(P)] for a in arms[:-1]}
    return RankCheck([a.name for a in arms], prompts, seeds, {a.name: rewards[a.name] for a in arms}, per,
                     {k: summarize(v) for k, v in per.items()}, {a.name: seconds[a.name] for a in arms}, hit_k, keep)


def group_correlation(draft: torch.Tensor, final: torch.Tensor) -> tuple[float | None, float | None]:
    """rho and tau of one prompt's N draft rewards against their full-precision, full-step rewards."""
    d, f = draft.float().numpy(), final.float().numpy()
    return spearman(d, f), kendall_tau_b(d, f)


def check(engine: Engine, prompts: list[str], per_prompt: int, *, seed_base: int, preview_steps: int, full_steps: int,
          hit_k: list[int], keep: int, progress: Callable[[str, float], None] | None = None) -> RankCheck:
    """The four arms on `engine`'s explore network (its explore copy) and its full-precision rollout
    network (as training's Stage 2), seeds seed_base + i*S ... for prompt i, scored with its rewards;
    six when the copy runs FP8 attention: its two arms with it, then the four without it."""
    if engine.explore_copy is None or engine.rewards is None:
        raise ValueError("rank-check needs an engine opened with its explore copy and rewards (open_engine(explore=True, rewards=...))")
    flat = [p for p in prompts for _ in range(per_prompt)]
    seeds = seed_base + torch.arange(len(prompts) * per_prompt, dtype=torch.long)
    copy_, full = engine.explore_copy, engine.dtype_name
    low = copy_.precision
    arms = [Arm(f"{low}@{preview_steps}", "explore", preview_steps), Arm(f"{low}@{full_steps}", "explore", full_steps),
            Arm(f"{full}@{preview_steps}", "rollout", preview_steps), Arm(f"{full}@{full_steps}", "rollout", full_steps)]
    if copy_.fp8_attention:  # both with and without it, on the same copy: attention's own share of the rank cost
        arms = [Arm(f"{low}+fp8-attention@{steps}", "explore", steps) for steps in (preview_steps, full_steps)] + [
            replace(arm, network=WITHOUT_FP8_ATTENTION) if arm.network == "explore" else arm for arm in arms]

    def images(on: str, steps: int) -> torch.Tensor:
        if on != WITHOUT_FP8_ATTENTION:
            return engine.images(flat, seeds, steps, on)
        with copy_.without_fp8_attention():
            return engine.images(flat, seeds, steps, "explore")

    return run_arms(arms, images, lambda x: engine.rewards(x, flat).total, prompts, seeds.view(len(prompts), per_prompt),
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
        return (f"keep {low.partition('@')[0]} for speed ({s_low:.1f}s vs {s_full:.1f}s); --explore-precision {precision} "
                f"ranks better here ({facts})")
    return (f"use --explore-precision {precision} for speed ({s_full:.1f}s vs {s_low:.1f}s); {low.partition('@')[0]} ranks "
            f"better here ({facts})")


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
                      f"{engine.model.description} | {plural(len(prompts), 'prompt')} x {plural(per_prompt, 'seed')} | {engine.device}")
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
    lo, hi = float(min(ref.min(), *(result.rewards[a].min() for a in result.arms))), float(max(ref.max(), *(result.rewards[a].max() for a in result.arms)))
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
