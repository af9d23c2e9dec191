"""Stage 1 alone (`solrl explore`, through its one core function `explore_request`, which checks the
options and opens the engine with its explore copy; Stage 1 planned as a run plans it: `stage_one`):
N seeds per prompt through the explore copy at the preview step count, scored, ranked, and the K
seeds Stage 2 would regenerate selected, exactly as a training iteration does: generated on the
engine's `explore` network (engine.py), screened for non-finite scores and selected by the
training's own `stages.keep_seeds` (ranked by the advantage the update sees, so several rewards
under `reward.aggregation = advantage` rank as in training; the same selection function, the same
stable tie order)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from solrl_core.tools.sources import output_folder, prompt_texts, reward_set, tool_config

if TYPE_CHECKING:  # torch: loaded only once the options are checked (explore_request)
    import torch

    from solrl_core.engine.engine import Engine
    from solrl_core.plan.plan import RunPlan


@dataclass(frozen=True)
class ExploreResult:
    prompts: list[str]
    seeds: torch.Tensor  # [P, N]
    rewards: torch.Tensor  # [P, N] total reward
    components: dict[str, torch.Tensor]  # [P, N] per reward
    # [P, N] 1 = best by the training's ranking (stages.draft_ranking), stable ties by seed order; a
    ranks: torch.Tensor
    # seed without a finite score ranks last
    selected: torch.Tensor  # [P, K] indices into N, in selection order
    images: torch.Tensor  # [P, N, 3, H, W]; a video model's clips [P, N, F, 3, H, W]
    seconds: float  # generation, decoding and scoring, measured
    precision: str
    steps: int

    @property
    def clips(self) -> bool:
        return self.images.dim() == 6


def explore_only(engine: Engine, prompts: list[str], n: int, keep: int, mode: str, seed_base: int,
                 steps: int) -> ExploreResult:
    """Seeds seed_base + i*N ... seed_base + i*N + N-1 for prompt i (so a result names its seeds),
    scored with the engine's rewards; a random selection mode draws from default_rng(seed_base)."""
    import torch

    with torch.no_grad():
        return _explore_only(engine, prompts, n, keep, mode, seed_base, steps)


def _explore_only(engine: Engine, prompts: list[str], n: int, keep: int, mode: str, seed_base: int,
                  steps: int) -> ExploreResult:
    import numpy as np
    import torch

    from solrl_core.data.prompts import text_keys
    from solrl_core.faults import guard
    from solrl_core.loop.stages import GlobalScores, Scored, draft_ranking, keep_seeds

    if engine.explore_copy is None or engine.rewards is None:
        raise ValueError("explore needs an engine opened with its explore copy and rewards (open_engine(explore=True, "
                         "rewards=...))")
    t0 = time.perf_counter()
    flat = [p for p in prompts for _ in range(n)]
    seeds = seed_base + torch.arange(len(prompts) * n, dtype=torch.long)
    groups = torch.arange(len(prompts)).repeat_interleave(n)
    made = engine.generate(engine.conditioning(flat), seeds, steps, "explore", groups=groups)  # batched as Stage 1 is
    scores = engine.rewards(made.images, flat)
    texts = torch.tensor(text_keys(flat), dtype=torch.long)
    every = GlobalScores(scores.total, scores.components, groups, slice(0, len(flat)), texts)
    drafts = Scored(batch=None, scores=every, screen=guard.screen(scores.components, groups))
    kept = keep_seeds(drafts, engine.config.reward, keep, mode, np.random.default_rng(seed_base))
    selected = kept.view(len(prompts), keep) - torch.arange(len(prompts))[:, None] * n
    # unscored: last
    ranking = draft_ranking(drafts, engine.config.reward).masked_fill(~drafts.screen.valid, -torch.inf)
    order = torch.argsort(ranking.view(len(prompts), n), dim=1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(1, n + 1).expand(len(prompts), n).contiguous())
    shape = (len(prompts), n)
    return ExploreResult(prompts, seeds.view(shape), scores.total.view(shape),
                         {k: v.view(shape) for k, v in scores.components.items()}, ranks, selected,
                         made.images.view(*shape, *made.images.shape[1:]), time.perf_counter() - t0,
                         engine.explore_copy.precision, steps)


def stage_one(engine: Engine) -> RunPlan:
    """The plan of Stage 1 a run of the engine's config makes with its explore copy: N seeds per
    prompt (`explore_seeds`), K kept (`keep`) and the preview steps (`explore_steps`)."""
    from solrl_core.plan.plan import plan_stages

    return plan_stages(engine.config, engine.dtype_name, engine.explore_copy.precision, engine.machine)


def explore_request(run: Optional[Path], *, prompt: Optional[list[str]] = None, prompts: Optional[str] = None,
                    model: Optional[str] = None, model_path: Optional[Path] = None, reward: Optional[str] = None,
                    n: Optional[int] = None, k: Optional[int] = None, steps: Optional[int] = None,
                    explore_precision: Optional[str] = None, checkpoint: Optional[str] = None,
                    out: Optional[Path] = None, sets: Optional[list[str]] = None, device: Optional[str] = None,
                    trust_run_config: bool = False) -> tuple[Engine, list[str], Path, Optional[Path]]:
    """What `solrl explore` runs, from its options: the engine of RUN's checkpoint (or of a base model)
    with its explore copy and rewards, the prompts (checked by the rewards), the output folder and the
    checkpoint. `n`, `k`, `steps` override explore.group_size, selection.group_size and explore.steps."""
    flags = {"explore": {"group_size": n, "steps": steps, "precision": explore_precision},
             "selection": {"group_size": k}, "run": {"device": device}}
    cfg, ckpt = tool_config(run, model, model_path, checkpoint, reward=reward, sets=sets, flags=flags,
                            trust=trust_run_config)
    from solrl_core.engine.engine import open_engine  # torch: only once the config is accepted

    texts, out_dir = prompt_texts(prompt, prompts, cfg.run.prompts), output_folder(out, run, "explore")
    rewards = reward_set(cfg)
    rewards.check_prompts(texts)
    return open_engine(cfg, checkpoint=ckpt, explore=True, rewards=rewards), texts, out_dir, ckpt


def explore_to_folder(engine: Engine, prompts: list[str], seed_base: int, out_dir: Path) -> ExploreResult:
    """`explore_only` with the plan's N, K and preview steps (`stage_one`) and the config's selection
    mode, written to `out_dir`: seeds.jsonl (every seed of every prompt: reward, each component, rank,
    selected) and grid.png (each prompt's K/2 best and K/2 worst images, captioned with seed and
    reward). A video model's clips show in the grid as their frames in a row, and the grid's clips are
    also written as videos (clips/PPP_seedS.mp4, or .gif without the video extra), named in their
    seeds.jsonl rows (`video`)."""
    import torch

    from solrl_core.io.images import grid_rows, make_grid

    plan = stage_one(engine)
    n, k = plan.explore_seeds, plan.keep
    result = explore_only(engine, prompts, n, k, engine.config.selection.mode, seed_base, plan.explore_steps)
    out_dir.mkdir(parents=True, exist_ok=True)
    half = k // 2
    order = torch.argsort(result.ranks, dim=1)  # best first, by the ranking the selection used
    picked = [order[:, r] for r in range(half)] + [order[:, n - half + r] for r in range(half)]
    names = [f"best {r + 1}" for r in range(half)] + [f"worst {half - r}" for r in range(half)]
    columns = {name: result.images[range(len(prompts)), col] for name, col in zip(names, picked)}
    captions = {name: [f"seed {int(result.seeds[i, j])}, reward {float(result.rewards[i, j]):.3g}"
                       for i, j in enumerate(col.tolist())]
                for name, col in zip(names, picked)}
    make_grid(columns, rows=grid_rows(prompts), captions=captions).save(out_dir / "grid.png")
    videos = _write_clips(result, picked, out_dir) if result.clips else {}
    with open(out_dir / "seeds.jsonl", "w", encoding="utf-8") as fh:
        for i, text in enumerate(prompts):
            chosen = set(result.selected[i].tolist())
            for j in range(n):
                video = {"video": videos[i, j]} if (i, j) in videos else {}
                fh.write(json.dumps({"prompt": text, "seed": int(result.seeds[i, j]),
                                     "reward": float(result.rewards[i, j]),
                                     **{f"reward.{c}": float(v[i, j]) for c, v in result.components.items()},
                                     "rank": int(result.ranks[i, j]), "selected": j in chosen, **video}) + "\n")
    return result


def _write_clips(result: ExploreResult, picked: list[torch.Tensor], out_dir: Path) -> dict[tuple[int, int], str]:
    """The grid's clips as video files under out_dir/clips/; {(prompt, seed index): path relative to out_dir}."""
    from solrl_core.io.video_output import save_clip

    (out_dir / "clips").mkdir(exist_ok=True)
    written = {}
    for col in picked:
        for i, j in enumerate(col.tolist()):
            if (i, j) not in written:
                stem = out_dir / "clips" / f"{i:03d}_seed{int(result.seeds[i, j])}"
                written[i, j] = str(save_clip(result.images[i, j], stem).relative_to(out_dir))
    return written
