"""How well a cheap Stage-1 rollout ranks a prompt's seeds against the reference: the measures the
rank check (rankcheck.py, `solrl rank-check`, the in-run check of stage1.py) and the calibration
(calibration.py) share.

An arm is one way of rolling out the same (prompt, seed) pairs (a network and a step count); each is
compared with the reference arm prompt by prompt: Spearman rho, Kendall tau-b (tau-b because a
reward may tie; a prompt where either arm is constant has no defined correlation and is counted
apart, never dropped silently), top-K and bottom-K hit rates (overlap of the K best, resp. worst,
seeds by the arm's reward with those by the reference, ranked by a stable sort as
`selection.select` ranks), and the reward gap of the best_worst selection: the reference reward of
the K/2 seeds the arm calls best minus that of the K/2 it calls worst, next to the same gap when the
reference selects (the largest possible). The training signal is that contrast.

Nothing here reads a config or a plan, nor imports the rank check or the calibration."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from solrl_core.loop.selection import select


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


def roll_arm(arm: Arm, generate_images: Callable[[str, int], torch.Tensor],
             score: Callable[[torch.Tensor], torch.Tensor],
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
    per = {a.name: [compare(rewards[a.name][i], rewards[reference][i], hit_k, keep) for i in range(P)]
           for a in arms[:-1]}
    return RankCheck([a.name for a in arms], prompts, seeds, {a.name: rewards[a.name] for a in arms}, per,
                     {k: summarize(v) for k, v in per.items()}, {a.name: seconds[a.name] for a in arms}, hit_k, keep)


def group_correlation(draft: torch.Tensor, final: torch.Tensor) -> tuple[float | None, float | None]:
    """rho and tau of one prompt's N draft rewards against their full-precision, full-step rewards."""
    d, f = draft.float().numpy(), final.float().numpy()
    return spearman(d, f), kendall_tau_b(d, f)
