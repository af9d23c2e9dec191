"""`solrl explore` (Stage 1 alone) and `solrl rank-check` (does the cheap rollout rank seeds like the
full one?): each calls its core function (solrl_core/tools/explore.py, rank_check.py), which checks
the options and loads the model with its explore copy, then the one that writes its files; the
command prints the result."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from solrl_cli import options as opt
from solrl_cli.common import console
from solrl_cli.errors import user_errors
from solrl_cli.tables import Column, print_fitted
from solrl_view.words import GIF_NOTE
from solrl_core.text import plural

ExploreRun = Annotated[Optional[Path], typer.Argument(help="A run folder: explore with its checkpoint's rollout (old) "
                                                           "adapter. Omit for a base model.")]
N = Annotated[Optional[int], typer.Option("--n", min=2, help="Seeds per prompt. Default: explore.group_size.")]
K = Annotated[Optional[int],
              typer.Option("--k", min=2, help="Seeds selected per prompt. Default: selection.group_size.")]
PreviewSteps = Annotated[Optional[int], typer.Option("--steps", min=1, help="Preview steps. Default: explore.steps.")]
ExploreSeed = Annotated[int, typer.Option("--seed", help="Prompt i uses seeds SEED + i*N ... SEED + i*N + N-1.")]
CheckRun = Annotated[Optional[Path], typer.Argument(help="A run folder: check with its checkpoint's rollout (old) "
                                                         "adapter. Omit for a base model.")]
Count = Annotated[int, typer.Option("--count", min=1, help="Use the first COUNT prompts of the set.")]
CheckSeeds = Annotated[int, typer.Option("--seeds", min=4, help="Seeds per prompt.")]
CheckSeed = Annotated[int, typer.Option("--seed", help="Prompt i uses seeds SEED + i*S ... SEED + i*S + S-1.")]
Preview = Annotated[Optional[int], typer.Option("--preview-steps", min=1, help="Default: explore.steps.")]
Full = Annotated[Optional[int], typer.Option("--full-steps", min=1, help="Default: sampler.steps.")]
Candidates = Annotated[bool, typer.Option("--candidates", help="Instead of the four arms: every preview step count "
                                          "from 2 to the full count at the explore precision and at each other low "
                                          "precision this machine runs, each one's recall of the reference's selection "
                                          "and its measured seconds, and the settings explore.calibrate=steps and "
                                          "=steps+precision would pick.")]
MinRecall = Annotated[Optional[float], typer.Option("--min-recall", min=0.0, max=1.0, help="With --candidates: the "
                                                    "recall a candidate must reach. Default: explore.min_recall (0: "
                                                    "the fixed setting's less its s.e.).")]
Fp8Attention = Annotated[bool, typer.Option("--fp8-attention", help="Run the explore copy with FP8 attention "
                                            "(explore.fp8_attention) and report its arms with and without it: six "
                                            "arms.")]
HitK = Annotated[Optional[list[int]], typer.Option("--hit-k", min=1, help="K of the top/bottom-K hit rates "
                                                                          "(repeatable). Default: 4 and 8.")]


def explore(
    run: ExploreRun = None, prompt: opt.Prompt = None, prompts: opt.Prompts = None, model: opt.Model = None,
    model_path: opt.ModelPath = None, reward: opt.Reward = None, n: N = None, k: K = None, steps: PreviewSteps = None,
    seed: ExploreSeed = 0, explore_precision: opt.ExplorePrecision = None, checkpoint: opt.Checkpoint = None,
    out: opt.Out = None, set_: opt.Sets = None, device: opt.Device = None, trust_run_config: opt.TrustRunConfig = False,
) -> None:
    """Stage 1 alone: N seeds per prompt at the explore precision and preview steps, scored, ranked, K selected."""
    with user_errors():
        from solrl_core.tools.explore import explore_request, explore_to_folder, stage_one

        engine, texts, out_dir, ckpt = explore_request(
            run, prompt=prompt, prompts=prompts, model=model, model_path=model_path, reward=reward, n=n, k=k,
            steps=steps, explore_precision=explore_precision, checkpoint=checkpoint, out=out, sets=set_, device=device,
            trust_run_config=trust_run_config)
        cfg, plan = engine.config, stage_one(engine)
        console.print(f"solrl explore  {ckpt or cfg.model.name + ' (base)'}  {plural(len(texts), 'prompt')} x "
                      f"{plural(plan.explore_seeds, 'seed')} at {engine.explore_copy.precision}, "
                      f"{plan.explore_steps} steps  -> keep {plan.keep} ({cfg.selection.mode})  on {engine.device}")
        result = explore_to_folder(engine, texts, seed, out_dir)
        _print_selection(result, plan.keep, out_dir)
        clips = f"   the grid's clips: {out_dir / 'clips'}" if result.clips else ""
        console.print(f"every seed: {out_dir / 'seeds.jsonl'}   grid of best and worst: {out_dir / 'grid.png'}{clips}")
        if result.clips and any((out_dir / "clips").glob("*.gif")):
            console.print(Text(f"  {GIF_NOTE}"))  # Text: its "[video]" is not markup


SHOWN = 8  # prompts whose selection is printed; every seed of every prompt is in seeds.jsonl


def _print_selection(result, keep: int, out_dir: Path) -> None:  # type: ignore[no-untyped-def]
    half = keep // 2
    rows = []
    for i, text in enumerate(result.prompts[:SHOWN]):
        sel = result.selected[i].tolist()
        fmt = lambda idx: ", ".join(  # noqa: E731
            f"{int(result.seeds[i, j])} ({float(result.rewards[i, j]):.3f})" for j in idx)
        rows.append((text, fmt(sel[:half]), fmt(sel[half:])))
    print_fitted(console, [Column(c, "text") for c in ("prompt", "best seeds (reward)", "worst seeds (reward)")], rows,
                 title=f"selected seeds ({result.seconds:.1f}s for {result.seeds.numel()} rollouts + rewards, "
                       "measured)")
    if len(result.prompts) > SHOWN:
        console.print(f"... and {plural(len(result.prompts) - SHOWN, 'more prompt')}: every seed of every prompt is in "
                      f"{out_dir / 'seeds.jsonl'}")


def rank_check(
    run: CheckRun = None, prompts: opt.Prompts = None, model: opt.Model = None, model_path: opt.ModelPath = None,
    reward: opt.Reward = None, count: Count = 16, seeds: CheckSeeds = 32, seed: CheckSeed = 0,
               preview_steps: Preview = None,
    full_steps: Full = None, hit_k: HitK = None, explore_precision: opt.ExplorePrecision = None,
    checkpoint: opt.Checkpoint = None, out: opt.Out = None, set_: opt.Sets = None, device: opt.Device = None,
    candidates: Candidates = False, min_recall: MinRecall = None, trust_run_config: opt.TrustRunConfig = False,
    fp8_attention: Fp8Attention = False,
) -> None:
    """Measure whether the cheap Stage-1 rollout ranks seeds like the full one: four arms, rho, tau, hit rates
    (--candidates: recall and seconds of every precision x preview step count, and what explore.calibrate would
    pick)."""
    with user_errors():
        from solrl_core.tools.rank_check import check_arms, check_candidates, rank_check_request, verdict

        check = rank_check_request(run, prompts=prompts, model=model, model_path=model_path, reward=reward,
                                   count=count, seeds=seeds, seed=seed, preview_steps=preview_steps,
                                   full_steps=full_steps, hit_k=hit_k, explore_precision=explore_precision,
                                   checkpoint=checkpoint, out=out, sets=set_, device=device, candidates=candidates,
                                   min_recall=min_recall, trust_run_config=trust_run_config,
                                   fp8_attention=fp8_attention)
        engine, texts, out_dir = check.engine, check.prompts, check.out_dir
        cfg = engine.config
        what = check.checkpoint or cfg.model.name + " (base)"
        console.print(f"solrl rank-check  {what}  {plural(len(texts), 'prompt')} x {plural(seeds, 'seed')}  "
                      f"on {engine.device}  rewards {', '.join(cfg.reward.weights)}")
        told = lambda arm, s: console.print(  # noqa: E731
            f"  {arm}: {plural(len(texts) * seeds, 'rollout')} scored in {s:.1f}s")
        if candidates:
            _print_candidates(*check_candidates(check, told), check.keep, engine.device)
            console.print(f"json: {out_dir / 'calibration.json'}")
            return
        result = check_arms(check, told)
        _print_arms(result, check.hit_k, check.keep, engine.device)
        console.print(f"json: {out_dir / 'rank_check.json'}   plot: {out_dir / 'rank_check.png'}")
        console.print(f"verdict: {verdict(result)}")


def _print_arms(result, ks: list[int], keep: int, where: object) -> None:  # type: ignore[no-untyped-def]
    names = ("rho", "tau", "n", *[f"top{k}" for k in ks], *[f"bot{k}" for k in ks], "gap", "ref gap", "s")
    rows = []
    for arm in result.arms:
        m = result.overall.get(arm)
        if m is None:
            rows.append((arm + " ref", *[""] * (len(names) - 1), f"{result.seconds[arm]:.1f}"))
            continue
        cor = [f"{m[c]:.3f}" if m[c] is not None else "-" for c in ("rho", "tau")]
        rows.append((arm, *cor, f"{m['defined']}/{m['prompts']}", *[f"{m[f'top{k}']:.2f}" for k in ks],
                     *[f"{m[f'bottom{k}']:.2f}" for k in ks], f"{m['gap_draft']:.3f}", f"{m['gap_final']:.3f}",
                     f"{result.seconds[arm]:.1f}"))
    print_fitted(console, [Column("arm", "key"), *map(Column, names)], rows,
                 title=f"against the reference {result.arms[-1]}, means over prompts, on {where}",
                 caption=f"rho, tau: over prompts where both arms vary (n of them); top/bot K: hit rates; gap: "
                         f"reference reward of the best {keep // 2} minus the worst {keep // 2} this arm selects (ref "
                         f"gap: when the "
                         "reference selects, the largest possible); s: seconds")


def _print_candidates(cal, by_steps, keep: int, where: object) -> None:  # type: ignore[no-untyped-def]
    cor = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    marks = lambda c: ((" (fixed)" if c.name == cal.fixed else "")  # noqa: E731
                       + (" <- steps" if c is by_steps else "") + (" <- steps+precision" if c is cal.chosen else ""))
    rows = [(c.name + marks(c), f"{c.recall:.3f}", f"{c.recall_se:.3f}", cor(c.rho), cor(c.tau), f"{c.seconds:.2f}")
            for c in cal.candidates]
    rows.append((cal.reference + " ref", "", "", "", "", f"{cal.reference_seconds:.2f}"))
    print_fitted(console, [Column("precision@steps", "key"), *map(Column, ("recall", "s.e.", "rho", "tau", "s"))], rows,
                 title=f"preview settings (precision x steps) against the reference {cal.reference}, means over "
                       f"prompts, on {where}",
                 caption=f"recall: share of the reference's best {keep // 2} and worst {keep // 2} the setting also "
                         "selects; s.e.: over prompts; s: seconds to generate, decode and score, measured")
    console.print(f"explore.calibrate=steps would pick {by_steps.name} (at the explore precision)")
    console.print(f"explore.calibrate=steps+precision would pick {cal.chosen.name}: {cal.why}")
