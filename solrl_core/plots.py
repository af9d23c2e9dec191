"""PNG figures of measured results (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from solrl_core.rankcheck import RankCheck, ranked


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
