"""`solrl eval` and `solrl.evaluate`: the one core function both call, `eval_request`, turns the
command's options into a checked `EvalRequest` (the config of a run or of a base model preset with
the overrides, its checkpoint, prompts, seeds, weight sets and output folder), a mistake said as a
SolrlError before torch loads; loop/evaluation.py `evaluate_weights` then scores it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from solrl_core.tools.sources import output_folder, pick_best, tool_config, weight_sets

if TYPE_CHECKING:
    from solrl_core.loop.evaluation import EvalRequest


def eval_request(run: Optional[Path], *, model: Optional[str] = None, model_path: Optional[Path] = None,
                 reward: Optional[str] = None, prompts: Optional[str] = None, seeds: Optional[int] = None,
                 steps: Optional[int] = None, weights: str = "ema", checkpoint: Optional[str] = None,
                 out: Optional[Path] = None, save_images: bool = False, sets: Optional[list[str]] = None,
                 device: Optional[str] = None, rewards: Optional[str] = None, trust_run_config: bool = False,
                 best: bool = False, say: Callable[[str], None] = lambda line: None) -> EvalRequest:
    """What `solrl eval` (and `solrl.evaluate`) scores, from its options: the config of RUN (or of a
    base model preset) with the overrides, its prompts, seeds, weight sets and output folder. `best`:
    the checkpoint --best picks (the highest trained-reward gain no hacking rule flagged), its choice
    told to `say`."""
    from solrl_core.data.prompts import load_prompts

    tuned = weight_sets(weights)
    extra = None if rewards is None else tuple(n.strip() for n in rewards.split(",") if n.strip())
    checkpoint, _, lines = pick_best(run, checkpoint, best)
    for line in lines:
        say(line)
    cfg, ckpt = tool_config(run, model, model_path, checkpoint, reward=reward, sets=sets, trust=trust_run_config,
                            flags={"run": {"device": device, "eval_rewards": extra}, "sampler": {"eval_steps": steps}})
    spec = prompts or cfg.run.eval_prompts or cfg.run.prompts
    from solrl_core.loop.evaluation import EvalRequest  # torch: only once the config is accepted

    return EvalRequest(config=cfg, prompts=load_prompts(spec), per_prompt=seeds or cfg.run.eval_seeds,
                       weights=("base", *tuned) if ckpt is not None else ("base",), checkpoint=ckpt,
                       out_dir=output_folder(out, run, "eval"), save_images=save_images, prompt_set=spec,
                       eval_rewards=cfg.run.eval_rewards, base_from=run)
