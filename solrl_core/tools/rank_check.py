"""`solrl rank-check`: does the cheap Stage-1 rollout rank seeds like the full one? Its one core
function, `rank_check_request`, checks the options (a mistake said before torch loads) and opens the
engine with its explore copy; `check_arms` then measures the four arms (loop/rankcheck.py), and
`check_candidates` every precision x preview step count explore.calibrate chooses among
(loop/calibration.py), each writing its files to the request's folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from solrl_core.errors import SolrlError
from solrl_core.tools.sources import output_folder, prompt_texts, reward_set, tool_config

if TYPE_CHECKING:  # torch: loaded only once the options are checked
    from solrl_core.engine.engine import Engine

Told = Callable[[str, float], None]  # (arm, seconds): each arm's rollouts scored


@dataclass(frozen=True)
class RankCheck:
    """A rank check ready to run: the engine with its explore copy and rewards, and what to measure."""

    engine: Engine
    prompts: list[str]
    out_dir: Path
    checkpoint: Optional[Path]
    per_prompt: int  # seeds per prompt
    seed_base: int
    keep: int  # K: the selection whose recall is measured
    hit_k: list[int]  # the top/bottom-K hit rates


def rank_check_request(run: Optional[Path], *, prompts: Optional[str] = None, model: Optional[str] = None,
                       model_path: Optional[Path] = None, reward: Optional[str] = None, count: int = 16,
                       seeds: int = 32, seed: int = 0, preview_steps: Optional[int] = None,
                       full_steps: Optional[int] = None, hit_k: Optional[list[int]] = None,
                       explore_precision: Optional[str] = None, checkpoint: Optional[str] = None,
                       out: Optional[Path] = None, sets: Optional[list[str]] = None,
                       device: Optional[str] = None, candidates: bool = False, min_recall: Optional[float] = None,
                       trust_run_config: bool = False, fp8_attention: bool = False) -> RankCheck:
    """What `solrl rank-check` measures, from its options: the config of RUN (or of a base model) with
    the overrides, the first `count` prompts, and the engine opened with its explore copy."""
    flags = {"explore": {"steps": preview_steps, "precision": explore_precision, "min_recall": min_recall,
                         "fp8_attention": True if fp8_attention else None},
             "sampler": {"steps": full_steps},
             "run": {"device": device}}
    cfg, ckpt = tool_config(run, model, model_path, checkpoint, reward=reward, sets=sets, flags=flags,
                            trust=trust_run_config)
    from solrl_core.engine.engine import open_engine  # torch: only once the config is accepted

    ks = sorted(set(hit_k or [4, 8]))
    if seeds < 2 * max(ks) and not candidates:
        raise SolrlError(f"--seeds {seeds} is too few for top/bottom-{max(ks)} hit rates",
                         f"use --seeds {2 * max(ks)} or more")
    keep = min(cfg.selection.group_size, seeds - seeds % 2)
    texts, out_dir = prompt_texts(None, prompts, cfg.run.prompts)[:count], output_folder(out, run, "rank_check")
    rewards = reward_set(cfg)
    rewards.check_prompts(texts)
    engine = open_engine(cfg, checkpoint=ckpt, explore=True, rewards=rewards)
    return RankCheck(engine, texts, out_dir, ckpt, seeds, seed, keep, ks)


def check_arms(check: RankCheck, progress: Told) -> Any:
    """The four arms against the reference (loop/rankcheck.py), written to rank_check.json and .png."""
    from solrl_core.loop.rankcheck import check_to_folder

    return check_to_folder(check.engine, check.prompts, check.out_dir, per_prompt=check.per_prompt,
                           seed_base=check.seed_base, hit_k=check.hit_k, keep=check.keep, progress=progress)


def check_candidates(check: RankCheck, progress: Told) -> Any:
    """Every preview step count at each low precision this machine runs, against the reference, and
    what explore.calibrate would pick (loop/calibration.py), written to calibration.json."""
    from solrl_core.loop.calibration import calibrate_to_folder
    from solrl_core.precision.hardware import runnable_low_precisions

    return calibrate_to_folder(check.engine, check.prompts, check.out_dir, per_prompt=check.per_prompt,
                               seed_base=check.seed_base, keep=check.keep,
                               precisions=runnable_low_precisions(check.engine.device), progress=progress)


def verdict(result: Any) -> str:
    """The rank check's one-line verdict (loop/rankcheck.py)."""
    from solrl_core.loop.rankcheck import verdict as said

    return said(result)
