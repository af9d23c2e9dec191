"""`solrl eval`: the base model, or a run's checkpoint against its base, scored on fixed prompts and seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from solrl_cli import options as opt
from solrl_cli.common import console
from solrl_cli.errors import user_errors
from solrl_cli.tables import Column, print_fitted
from solrl_core.text import plural

Run = Annotated[Optional[Path], typer.Argument(help="A run folder: its newest checkpoint is scored against the base "
                                                    "model. Omit to score a base model.")]
Seeds = Annotated[Optional[int],
                  typer.Option("--seeds", min=1, help="Fixed seeds per prompt. Default: run.eval_seeds.")]
EvalRewards = Annotated[Optional[str], typer.Option(
    "--rewards", help="Rewards to score besides the run's own, comma-separated (e.g. "
                      "imagereward,pickscore,clipscore,hpsv2), each base -> tuned with its paired s.e. Default: "
                      "run.eval_rewards; '' for none.")]
SaveImages = Annotated[bool, typer.Option("--save-images", help="Keep every image as PNG under OUT/images/.")]


def eval_(
    run: Run = None, model: opt.Model = None, model_path: opt.ModelPath = None, reward: opt.Reward = None,
    prompts: opt.Prompts = None, seeds: Seeds = None, steps: opt.EvalSteps = None, weights: opt.Weights = "ema",
    checkpoint: opt.Checkpoint = None, out: opt.Out = None, save_images: SaveImages = False, set_: opt.Sets = None,
    device: opt.Device = None, rewards: EvalRewards = None, trust_run_config: opt.TrustRunConfig = False,
          best: opt.Best = False,
) -> None:
    """Score the base model, or a run's checkpoint against its base, with one or more rewards."""
    with user_errors():
        from solrl_core.tools.evaluate import eval_request

        req = eval_request(run, model=model, model_path=model_path, reward=reward, prompts=prompts, seeds=seeds,
                           steps=steps,
                           weights=weights, checkpoint=checkpoint, out=out, save_images=save_images, sets=set_,
                           device=device,
                           rewards=rewards, trust_run_config=trust_run_config, best=best, say=console.print)
        from solrl_view.display import TerminalDisplay
        from solrl_core import events  # torch: only once the config is accepted
        from solrl_core.loop.evaluation import EvalStopped, evaluate_weights

        cfg, extra = req.config, req.eval_rewards
        console.print(f"solrl eval  {req.checkpoint or cfg.model.name + ' (base)'}  prompts {req.prompt_set} "
                      f"({len(req.prompts)} x {plural(req.per_prompt, 'seed')})  steps {cfg.sampler.eval_steps}  "
                      f"rewards {', '.join(cfg.reward.weights)}"
                      + (f"  eval rewards {', '.join(extra)}" if extra else ""))
        bus = events.EventBus()
        bus.subscribe(TerminalDisplay(console))
        try:
            results = evaluate_weights(req, bus)
        except EvalStopped as stop:
            console.print(stop.message, soft_wrap=True)
            raise typer.Exit(130) from None
        _print_table(results, req)


def _print_table(results, req) -> None:  # type: ignore[no-untyped-def]
    from solrl_core.loop.evaluation import summary
    from solrl_core.runtime.device import resolve_device

    title = (f"{req.prompt_set}: {plural(len(req.prompts), 'prompt')} x {plural(req.per_prompt, 'seed')}, "
             f"{req.config.sampler.eval_steps} steps, on {resolve_device(req.config.run.device)}  (delta: versus base, "
             f"on the same prompts and seeds; s.e.: its standard error over the paired images)")
    rows = []
    stats = summary(results)
    several = len(req.config.reward.weights) > 1
    for weights, entry in stats.items():
        first = weights == results[0].weights
        for name, row in entry["rewards"].items():
            if name == "total" and not several:
                continue
            rows.append((weights, name if name != "total" else "weighted sum", f"{row['mean']:.4f}",
                         f"{row['std']:.4f}",
                         "" if first else f"{row['delta']:+.4f}", "" if first else f"{row['delta_se']:.4f}"))
        for key, value in entry["extras"].items():
            delta, se = entry.get("extras_delta", {}).get(key), entry.get("extras_delta_se", {}).get(key)
            rows.append((weights, key, f"{value:.4f}", "", "" if delta is None else f"{delta:+.4f}",
                         "" if se is None else f"{se:.4f}"))
        for name, row in entry.get("eval_rewards", {}).items():  # scored, not trained on
            rows.append((weights, f"{name} (eval)", f"{row['mean']:.4f}", f"{row['std']:.4f}",
                         "" if first else f"{row['delta']:+.4f}", "" if first else f"{row['delta_se']:.4f}"))
    columns = [Column("weights", "key"), Column("reward", "text"), *map(Column, ("mean", "std", "delta", "s.e."))]
    print_fitted(console, columns, rows, title=title)
    console.print(f"per-image scores: {req.out_dir / 'samples.jsonl'}   summary: {req.out_dir / 'summary.json'}"
                  + (f"   images: {req.out_dir / 'images'}" if req.save_images else ""))
