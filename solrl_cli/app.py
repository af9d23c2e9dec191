"""The `solrl` command: thin commands over solrl_core."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from solrl_cli import options as opt
from solrl_cli.errors import user_errors

app = typer.Typer(name="solrl", no_args_is_help=False, add_completion=False, pretty_exceptions_enable=False,
                  help="Sol-RL post-training for text-to-image flow models: FP4 explore, full-precision train.")
console = Console(highlight=False, soft_wrap=True)

PRECEDENCE = "defaults < model preset < family preset < reward preset < --config FILE < --set < explicit flags"


@app.command()
def train(
    model: opt.Model = None,
    model_path: opt.ModelPath = None,
    family: opt.Family = None,
    reward: opt.Reward = None,
    preset: opt.Preset = None,
    config: opt.ConfigFile = None,
    set_: opt.Sets = None,
    prompts: opt.Prompts = None,
    run_dir: opt.RunDir = None,
    iterations: opt.Iterations = None,
    seed: opt.Seed = None,
    device: opt.Device = None,
    explore_precision: opt.ExplorePrecision = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue the run in this folder from its newest checkpoint (checked against its manifest).")] = None,
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", help="With --resume: the checkpoint to continue from (iter_000030); newer ones are set aside. Default: the newest.")] = None,
    log: Annotated[Optional[str], typer.Option("--log", help="Experiment trackers, comma-separated: tensorboard, wandb (run.log; needs pip install -e \".[tracking]\").")] = None,
    tui: Annotated[bool, typer.Option("--tui", help="Watch the run in a terminal UI; q asks whether to stop safely with a checkpoint.")] = False,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", min=1, help="Processes (one per GPU) on this node; above 1 they are started through torchrun.")] = 1,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="Nodes in the run; start the same command on each with its --node-rank.")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="This node's index, 0 to nnodes-1.")] = 0,
    rdzv_endpoint: Annotated[Optional[str], typer.Option("--rdzv-endpoint", help="HOST:PORT of node 0 (needed with --nnodes > 1).")] = None,
    dump_config: Annotated[bool, typer.Option("--dump-config", help="Print the resolved config as TOML and exit.")] = False,
) -> None:
    """Train with Sol-RL (or another family). With no arguments: the built-in tiny model on this machine."""
    from solrl_core import events
    from solrl_core.presets import resolve_config
    from solrl_core.rundir import load_run_config
    from solrl_core.trainer import train as run_training
    from solrl_cli.display import TerminalDisplay

    with user_errors():
        flags = {"run": {"prompts": prompts, "run_dir": str(run_dir) if run_dir else None, "iterations": iterations,
                         "seed": seed, "device": device,
                         "log": [t.strip() for t in log.split(",") if t.strip()] if log is not None else None},
                 "explore": {"precision": explore_precision}, "model": {"path": str(model_path) if model_path else None}}
        flags = {sec: {k: v for k, v in vals.items() if v is not None} for sec, vals in flags.items()}
        if resume:
            cfg = _resume_config(resume, load_run_config(resume), model, family, reward, preset, config, set_, flags)
        else:
            cfg = resolve_config(model or "tiny", family or "sol_rl", reward, preset, config, set_ or (), flags)
        if dump_config:
            _print_config(cfg)
            return
        _preflight(cfg, nproc_per_node)
        if nproc_per_node > 1 or nnodes > 1:  # torch.distributed's own launcher re-runs this command per process
            import sys

            from solrl_cli.launch import launch

            raise typer.Exit(launch(nproc_per_node, nnodes, node_rank, rdzv_endpoint, sys.argv[1:],
                                    prompts_per_iteration=cfg.run.prompts_per_iteration))
        if tui:
            from solrl_cli.tui import run_tui_training

            session = run_tui_training(cfg, resume=bool(resume), checkpoint=checkpoint)
        else:
            bus = events.EventBus()
            bus.subscribe(TerminalDisplay(console))
            session = run_training(cfg, bus, resume=bool(resume), checkpoint=checkpoint)
        if session.state.iteration < session.run.config.run.iterations:
            raise typer.Exit(130)  # stopped by a signal: saved, but not finished


def _preflight(cfg, nproc: int) -> None:  # type: ignore[no-untyped-def]
    """The doctor checks this run depends on, before anything big loads. The memory figure is an
    estimate, so it never blocks a run (doctor shows it)."""
    from solrl_core.doctor import failed_for_run, run_checks
    from solrl_core.errors import SolrlError
    from solrl_core.tracking import require

    require(cfg.run.log)
    failed = [c for c in failed_for_run(run_checks(cfg, nproc)) if c.name != "memory estimate"]
    failed.sort(key=lambda c: c.name != "explore precision")  # the root cause when TE rows fail with it
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more: `solrl doctor` lists them)" if len(failed) > 1 else ""
        raise SolrlError(f"{first.name}: {first.detail}{more}", first.fix or "run `solrl doctor` for details")


def _resume_config(run_dir, saved, model, family, reward, preset, config, sets, flags):  # type: ignore[no-untyped-def]
    from solrl_core.config import from_dict, set_value
    from solrl_core.errors import SolrlError

    if any((model, family, reward, preset, config)) or set(flags["run"]) - {"iterations", "device", "log"} or flags["explore"]:
        raise SolrlError("--resume continues a run with the config saved in its folder",
                         "only --iterations, --device, --log, --model-path and --set may be given with --resume")
    cfg = saved
    for assignment in sets or ():
        cfg = set_value(cfg, assignment)
    return from_dict({"run": {**flags["run"], "run_dir": str(run_dir)}, "model": flags["model"]}, cfg,
                     source="command-line flags").validate()


def _print_config(cfg) -> None:  # type: ignore[no-untyped-def]
    import tomli_w

    from solrl_core.config import to_dict

    print(f"# solrl resolved config for preset {cfg.preset}\n# precedence: {PRECEDENCE}")
    print(tomli_w.dumps(to_dict(cfg)), end="")


@app.command("eval")
def eval_(
    run: Annotated[Optional[Path], typer.Argument(help="A run folder: its newest checkpoint is scored against the base model. Omit to score a base model.")] = None,
    model: opt.Model = None,
    model_path: opt.ModelPath = None,
    reward: opt.Reward = None,
    prompts: opt.Prompts = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", min=1, help="Fixed seeds per prompt. Default: run.eval_seeds.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Sampling steps. Default: sampler.eval_steps.")] = None,
    weights: Annotated[str, typer.Option("--weights", help="Tuned weights to score besides the base: ema, trained or ema,trained.")] = "ema",
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", help="Checkpoint folder name (iter_000030) or path. Default: the newest.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Output folder. Default: RUN/eval/<time>, or runs/eval-<time>.")] = None,
    save_images: Annotated[bool, typer.Option("--save-images", help="Keep every image as PNG under OUT/images/.")] = False,
    set_: opt.Sets = None,
    device: opt.Device = None,
) -> None:
    """Score the base model, or a run's checkpoint against its base, with one or more rewards."""
    from solrl_core import events
    from solrl_core.config import from_dict, set_value
    from solrl_core.evaluation import EvalRequest, evaluate_weights
    from solrl_core.prompts import load_prompts
    from solrl_cli.display import TerminalDisplay

    with user_errors():
        tuned = _weight_sets(weights)
        cfg, ckpt = _model_and_checkpoint(run, model, model_path, checkpoint)
        order = ("base", *tuned) if ckpt is not None else ("base",)
        out_dir = _output_folder(out, run, "eval")
        cfg = _override_rewards(cfg, reward)
        for assignment in set_ or ():
            cfg = set_value(cfg, assignment)
        changes = {"run": {"device": device} if device else {}, "sampler": {"eval_steps": steps} if steps else {}}
        cfg = from_dict(changes, cfg, source="command-line flags").validate()
        prompt_spec = prompts or cfg.run.eval_prompts or cfg.run.prompts
        req = EvalRequest(config=cfg, prompts=load_prompts(prompt_spec), per_prompt=seeds or cfg.run.eval_seeds,
                          weights=order, checkpoint=ckpt, out_dir=Path(out_dir), save_images=save_images, prompt_set=prompt_spec)
        console.print(f"[bold]solrl eval[/bold]  {ckpt or cfg.model.name + ' (base)'}  prompts {prompt_spec} "
                      f"({len(req.prompts)} x {req.per_prompt} seeds)  steps {cfg.sampler.eval_steps}  "
                      f"rewards {', '.join(cfg.reward.weights)}")
        bus = events.EventBus()
        bus.subscribe(TerminalDisplay(console))
        results = evaluate_weights(req, bus)
        _print_eval_table(results, req)


@app.command()
def infer(
    run: Annotated[Optional[Path], typer.Argument(help="A run folder: images from its checkpoint next to the base model's. Omit for a base model alone.")] = None,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="A prompt (repeatable).")] = None,
    prompts: opt.Prompts = None,
    model: opt.Model = None,
    model_path: opt.ModelPath = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Images per prompt, from seeds SEED..SEED+n-1.")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="First seed.")] = 0,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Sampling steps. Default: sampler.eval_steps.")] = None,
    weights: Annotated[str, typer.Option("--weights", help="Tuned weights beside the base: ema, trained or ema,trained.")] = "ema",
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", help="Checkpoint folder name or path. Default: the newest ('last').")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Output folder. Default: RUN/infer/<time>, or runs/infer-<time>.")] = None,
    grid: Annotated[bool, typer.Option("--grid/--no-grid", help="Write grid.png: one row per (prompt, seed), one column per weight set.")] = True,
    set_: opt.Sets = None,
    device: opt.Device = None,
) -> None:
    """Generate images from fixed seeds with the base model and a run's tuned weights, side by side."""
    from solrl_core import events
    from solrl_core.config import from_dict, set_value
    from solrl_core.inference import InferRequest, infer as run_infer, load_tuned
    from solrl_cli.display import TerminalDisplay

    with user_errors():
        tuned = _weight_sets(weights)
        cfg, ckpt = _model_and_checkpoint(run, model, model_path, checkpoint)
        for assignment in set_ or ():
            cfg = set_value(cfg, assignment)
        if device:
            cfg = from_dict({"run": {"device": device}}, cfg, source="--device")
        texts = _prompt_texts(prompt, prompts, cfg.run.eval_prompts or cfg.run.prompts)
        out_dir = _output_folder(out, run, "infer")
        req = InferRequest(prompts=texts, seeds=list(range(seed, seed + seeds)), weights=("base", *tuned) if ckpt else ("base",),
                           steps=steps or cfg.sampler.eval_steps, out_dir=Path(out_dir), grid=grid)
        console.print(f"[bold]solrl infer[/bold]  {ckpt or cfg.model.name + ' (base)'}  {len(texts)} prompts x {seeds} seeds  "
                      f"steps {req.steps}  weights {', '.join(req.weights)}")
        bus = events.EventBus()
        bus.subscribe(TerminalDisplay(console))
        rows = run_infer(load_tuned(cfg, ckpt), req, bus)
        console.print(f"images: {req.out_dir}   index: {rows}" + (f"   grid: {req.out_dir / 'grid.png'}" if grid else ""))


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="A run folder.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write.")],
    weights: Annotated[str, typer.Option("--weights", help="ema or trained.")] = "ema",
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", help="Checkpoint folder name or path. Default: the newest.")] = None,
    merge: Annotated[bool, typer.Option("--merge", help="Write the full transformer with the LoRA merged in, instead of the LoRA alone.")] = False,
    model_path: opt.ModelPath = None,
) -> None:
    """Export a run's tuned weights: the LoRA in diffusers' format, or (--merge) a merged transformer."""
    import json
    import shutil

    from solrl_core.errors import SolrlError
    from solrl_core.inference import export_merged, load_tuned
    from solrl_core.policy import LORA_FILE

    with user_errors():
        sets = _weight_sets(weights)
        if len(sets) != 1:
            raise SolrlError("--weights takes one weight set for export", "--weights ema or --weights trained")
        which = sets[0]
        cfg, ckpt = _model_and_checkpoint(run, None, model_path, checkpoint)
        if out.exists() and any(out.iterdir()):
            raise SolrlError(f"{out} exists and is not empty", "choose a new --out folder")
        out.mkdir(parents=True, exist_ok=True)
        if merge:
            path = export_merged(load_tuned(cfg, ckpt), which, out)
            cls = json.loads((path / "config.json").read_text())["_class_name"]
            console.print(f"merged transformer ({which} weights of {ckpt.name}) -> {path}  (load with diffusers' "
                          f"{cls}.from_pretrained('{path}'))")
        else:
            source = ckpt / LORA_FILE if which == "trained" else ckpt / "ema" / LORA_FILE
            shutil.copy2(source, out / LORA_FILE)
            console.print(f"LoRA ({which} weights of {ckpt.name}) -> {out / LORA_FILE}  (load with pipe.load_lora_weights('{out}'))")


def _weight_sets(text: str) -> tuple[str, ...]:
    from solrl_core.errors import SolrlError

    sets = tuple(w.strip() for w in text.split(",") if w.strip())
    if not sets or any(w not in ("ema", "trained") for w in sets):
        raise SolrlError(f"--weights {text}: expected ema, trained or both", "for example --weights ema,trained")
    return sets


@app.command("explore")
def explore_cmd(
    run: Annotated[Optional[Path], typer.Argument(help="A run folder: explore with its checkpoint's rollout (old) adapter. Omit for a base model.")] = None,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="A prompt (repeatable).")] = None,
    prompts: opt.Prompts = None,
    model: opt.Model = None,
    model_path: opt.ModelPath = None,
    reward: opt.Reward = None,
    n: Annotated[Optional[int], typer.Option("--n", min=2, help="Seeds per prompt. Default: explore.group_size.")] = None,
    k: Annotated[Optional[int], typer.Option("--k", min=2, help="Seeds selected per prompt. Default: selection.group_size.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Preview steps. Default: explore.steps.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Prompt i uses seeds SEED + i*N ... SEED + i*N + N-1.")] = 0,
    explore_precision: opt.ExplorePrecision = None,
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", help="Checkpoint folder name or path. Default: the newest.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Output folder. Default: RUN/explore/<time>, or runs/explore-<time>.")] = None,
    set_: opt.Sets = None,
    device: opt.Device = None,
) -> None:
    """Stage 1 alone: N seeds per prompt at the explore precision and preview steps, scored, ranked, K selected."""
    import json

    import torch

    from solrl_core.inference import load_tuned, make_grid
    from solrl_core.device import resolve_device
    from solrl_core.stage1 import explore_only

    with user_errors():
        cfg, ckpt, texts, out_dir = _tool_setup("explore", run, prompt, prompts, model, model_path, reward, checkpoint, out, set_,
                                                device, explore_precision,
                                                {"explore": {"group_size": n, "steps": steps}, "selection": {"group_size": k}})
        rewards = _reward_set(cfg)
        rewards.check_prompts(texts)
        loaded = load_tuned(cfg, ckpt, explore=True)
        n_, k_ = cfg.explore.group_size, cfg.selection.group_size
        console.print(f"[bold]solrl explore[/bold]  {ckpt or cfg.model.name + ' (base)'}  {len(texts)} prompts x {n_} seeds at "
                      f"{loaded.explore_copy.precision}, {cfg.explore.steps} steps  -> keep {k_} ({cfg.selection.mode})  "
                      f"on {resolve_device(cfg.run.device)}")
        result = explore_only(loaded, rewards, texts, n_, k_, cfg.selection.mode, seed, cfg.explore.steps)
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "seeds.jsonl", "w", encoding="utf-8") as fh:
            for i, text in enumerate(texts):
                chosen = set(result.selected[i].tolist())
                for j in range(n_):
                    fh.write(json.dumps({"prompt": text, "seed": int(result.seeds[i, j]), "reward": float(result.rewards[i, j]),
                                         **{f"reward.{c}": float(v[i, j]) for c, v in result.components.items()},
                                         "rank": int(result.ranks[i, j]), "selected": j in chosen}) + "\n")
        half = k_ // 2
        order = torch.argsort(result.rewards, dim=1, descending=True, stable=True)
        columns = {f"best {r + 1}": result.images[range(len(texts)), order[:, r]] for r in range(half)}
        columns.update({f"worst {half - r}": result.images[range(len(texts)), order[:, n_ - half + r]] for r in range(half)})
        make_grid(columns).save(out_dir / "grid.png")
        table = Table(title=f"selected seeds ({result.seconds:.1f}s for {len(texts) * n_} rollouts + rewards, measured)")
        for col in ("prompt", "best seeds (reward)", "worst seeds (reward)"):
            table.add_column(col)
        for i, text in enumerate(texts):
            sel = result.selected[i].tolist()
            fmt = lambda idx: ", ".join(f"{int(result.seeds[i, j])} ({float(result.rewards[i, j]):.3f})" for j in idx)  # noqa: E731
            table.add_row(text[:60], fmt(sel[:half]), fmt(sel[half:]))
        console.print(table)
        console.print(f"every seed: {out_dir / 'seeds.jsonl'}   grid of best and worst: {out_dir / 'grid.png'}")


@app.command("rank-check")
def rank_check(
    run: Annotated[Optional[Path], typer.Argument(help="A run folder: check with its checkpoint's rollout (old) adapter. Omit for a base model.")] = None,
    prompts: opt.Prompts = None,
    model: opt.Model = None,
    model_path: opt.ModelPath = None,
    reward: opt.Reward = None,
    count: Annotated[int, typer.Option("--count", min=1, help="Use the first COUNT prompts of the set.")] = 16,
    seeds: Annotated[int, typer.Option("--seeds", min=4, help="Seeds per prompt.")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Prompt i uses seeds SEED + i*S ... SEED + i*S + S-1.")] = 0,
    preview_steps: Annotated[Optional[int], typer.Option("--preview-steps", min=1, help="Default: explore.steps.")] = None,
    full_steps: Annotated[Optional[int], typer.Option("--full-steps", min=1, help="Default: sampler.steps.")] = None,
    hit_k: Annotated[Optional[list[int]], typer.Option("--hit-k", min=1, help="K of the top/bottom-K hit rates (repeatable). Default: 4 and 8.")] = None,
    explore_precision: opt.ExplorePrecision = None,
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", help="Checkpoint folder name or path. Default: the newest.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Output folder. Default: RUN/rank_check/<time>, or runs/rank-check-<time>.")] = None,
    set_: opt.Sets = None,
    device: opt.Device = None,
) -> None:
    """Measure whether the cheap Stage-1 rollout ranks seeds like the full one: four arms, rho, tau, hit rates."""
    import json

    from solrl_core.errors import SolrlError
    from solrl_core.inference import load_tuned
    from solrl_core.plots import rank_check_figure
    from solrl_core.rankcheck import check
    from solrl_core.device import resolve_device
    from solrl_core.rundir import write_atomic

    with user_errors():
        cfg, ckpt, texts, out_dir = _tool_setup("rank_check", run, None, prompts, model, model_path, reward, checkpoint, out, set_,
                                                device, explore_precision,
                                                {"explore": {"steps": preview_steps}, "sampler": {"steps": full_steps}})
        ks = sorted(set(hit_k or [4, 8]))
        if seeds < 2 * max(ks):
            raise SolrlError(f"--seeds {seeds} is too few for top/bottom-{max(ks)} hit rates", f"use --seeds {2 * max(ks)} or more")
        keep = min(cfg.selection.group_size, seeds - seeds % 2)
        texts = texts[:count]
        rewards = _reward_set(cfg)
        rewards.check_prompts(texts)
        loaded = load_tuned(cfg, ckpt, explore=True)
        where = resolve_device(cfg.run.device)
        console.print(f"[bold]solrl rank-check[/bold]  {ckpt or cfg.model.name + ' (base)'}  {len(texts)} prompts x {seeds} seeds  "
                      f"on {where}  rewards {', '.join(cfg.reward.weights)}")
        result = check(loaded, rewards, texts, seeds, seed, cfg.explore.steps, cfg.sampler.steps, ks, keep,
                       progress=lambda arm, s: console.print(f"  {arm}: {len(texts) * seeds} rollouts scored in {s:.1f}s"))
        table = Table(title=f"against the reference {result.arms[-1]}, means over prompts, on {where}",
                      caption=f"rho, tau: over prompts where both arms vary (n of them); top/bot K: hit rates; gap: reference "
                              f"reward of the best {keep // 2} minus the worst {keep // 2} this arm selects (ref gap: when the "
                              "reference selects, the largest possible); s: seconds")
        table.add_column("arm", no_wrap=True)
        for col in ("rho", "tau", "n", *[f"top{k}" for k in ks], *[f"bot{k}" for k in ks], "gap", "ref gap", "s"):
            table.add_column(col, justify="right", no_wrap=True)
        for arm in result.arms:
            m = result.overall.get(arm)
            if m is None:
                table.add_row(arm + " ref", *[""] * (5 + 2 * len(ks)), f"{result.seconds[arm]:.1f}")
                continue
            cor = [f"{m[c]:.3f}" if m[c] is not None else "-" for c in ("rho", "tau")]
            table.add_row(arm, *cor, f"{m['defined']}/{m['prompts']}", *[f"{m[f'top{k}']:.2f}" for k in ks],
                          *[f"{m[f'bottom{k}']:.2f}" for k in ks], f"{m['gap_draft']:.3f}", f"{m['gap_final']:.3f}",
                          f"{result.seconds[arm]:.1f}")
        console.print(table)
        out_dir.mkdir(parents=True, exist_ok=True)
        meta = {"device": str(where), "model": loaded.model.description, "checkpoint": str(ckpt) if ckpt else None,
                "rewards": cfg.reward.weights}
        write_atomic(out_dir / "rank_check.json", json.dumps({"meta": meta, **result.to_dict()}, indent=2))
        rank_check_figure(result, out_dir / "rank_check.png",
                          f"{loaded.model.description} | {len(texts)} prompts x {seeds} seeds | {where}")
        console.print(f"json: {out_dir / 'rank_check.json'}   plot: {out_dir / 'rank_check.png'}")


def _tool_setup(kind, run, prompt, prompts, model, model_path, reward, checkpoint, out, sets, device, explore_precision, flags):  # type: ignore[no-untyped-def]
    """Config, checkpoint, prompts and output folder shared by explore and rank-check."""
    from solrl_core.config import from_dict, set_value

    cfg, ckpt = _model_and_checkpoint(run, model, model_path, checkpoint)
    cfg = _override_rewards(cfg, reward)
    for assignment in sets or ():
        cfg = set_value(cfg, assignment)
    flags = {sec: {k: v for k, v in vals.items() if v is not None} for sec, vals in flags.items()}
    flags["run"] = {"device": device} if device else {}
    flags["explore"] = {**flags.get("explore", {}), **({"precision": explore_precision} if explore_precision else {})}
    cfg = from_dict(flags, cfg, source="command-line flags").validate()
    return cfg, ckpt, _prompt_texts(prompt, prompts, cfg.run.prompts), _output_folder(out, run, kind)


def _prompt_texts(prompt: Optional[list[str]], prompts: Optional[str], default: str) -> list[str]:
    """The --prompt texts, else the --prompts file or set, else `default` (a prompt set or file)."""
    from solrl_core.errors import SolrlError
    from solrl_core.prompts import load_prompts

    if prompt and prompts:
        raise SolrlError("both --prompt and --prompts given", "use one: --prompt TEXT (repeatable) or --prompts FILE_OR_SET")
    return [p for p in (prompt or []) if p.strip()] or load_prompts(prompts or default)


def _output_folder(out: Optional[Path], run: Optional[Path], kind: str) -> Path:
    """--out, else RUN/<kind>/<time> for a run, else runs/<kind>-<time>."""
    import datetime as dt

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(out or (run / kind / stamp if run is not None else Path("runs") / f"{kind.replace('_', '-')}-{stamp}"))


def _reward_set(cfg):  # type: ignore[no-untyped-def]
    from solrl_core.rewards import RewardSet
    from solrl_core.device import resolve_device

    return RewardSet.from_config(cfg.reward, resolve_device(cfg.run.device))


def _override_rewards(cfg, reward: Optional[str]):  # type: ignore[no-untyped-def]
    """--reward on a loaded config: a preset or reward name, or NAME=W,NAME=W; keeps the matching paths."""
    from solrl_core.config import from_dict
    from solrl_core.rewards import parse_weights

    if not reward:
        return cfg
    names = parse_weights(reward) if ("=" in reward or "," in reward) else _reward_preset_weights(reward)
    return from_dict({"reward": {"weights": names, "paths": {k: v for k, v in cfg.reward.paths.items() if k in names}}}, cfg,
                     source="--reward")


def _model_and_checkpoint(run: Optional[Path], model: Optional[str], model_path: Optional[Path], checkpoint: Optional[str]):  # type: ignore[no-untyped-def]
    """The config and checkpoint of a run folder, or a base model preset with no checkpoint."""
    from solrl_core.checkpoint import list_checkpoints
    from solrl_core.config import from_dict
    from solrl_core.errors import SolrlError
    from solrl_core.presets import resolve_config
    from solrl_core.rundir import load_run_config

    if run is not None:
        if model:
            raise SolrlError("--model is taken from the run's saved config", "drop --model, or omit RUN to use a base model")
        cfg, ckpt = load_run_config(run), _pick_checkpoint(run, list_checkpoints(run), checkpoint)
    else:
        if checkpoint:
            raise SolrlError("--checkpoint needs a RUN folder", "pass the run folder as the first argument")
        cfg, ckpt = resolve_config(model or "tiny", "sol_rl"), None
    if model_path:
        cfg = from_dict({"model": {"path": str(model_path)}}, cfg, source="--model-path")
    return cfg, ckpt


def _pick_checkpoint(run: Path, found: list[Path], name: Optional[str]) -> Path:
    from solrl_core.checkpoint import pick_checkpoint
    from solrl_core.errors import SolrlError
    from solrl_core.faults.manifest import verify

    if not found:
        raise SolrlError(f"{run} holds no complete checkpoint", "train it for at least one checkpoint interval first")
    path = pick_checkpoint(run, found, name)
    problem = verify(path)
    if problem is not None:
        raise SolrlError(f"checkpoint {path.name} is torn or corrupt ({problem})",
                         "pick another with --checkpoint: " + ", ".join(p.name for p in found if p != path))
    return path


def _reward_preset_weights(name: str) -> dict[str, float]:
    from solrl_core.presets import get_preset
    from solrl_core.rewards import reward_names

    if name in reward_names():
        return {name: 1.0}
    return dict(get_preset("rewards", name).values["reward"]["weights"])


def _print_eval_table(results, req) -> None:  # type: ignore[no-untyped-def]
    from solrl_core.evaluation import summary
    from solrl_core.device import resolve_device

    table = Table(title=f"{req.prompt_set}: {len(req.prompts)} prompts x {req.per_prompt} seeds, {req.config.sampler.eval_steps} "
                        f"steps, on {resolve_device(req.config.run.device)}  (delta: versus base)")
    for col in ("weights", "reward", "mean", "std", "delta"):
        table.add_column(col, justify="left" if col in ("weights", "reward") else "right")
    stats = summary(results)
    several = len(req.config.reward.weights) > 1
    for weights, entry in stats.items():
        for name, row in entry["rewards"].items():
            if name == "total" and not several:
                continue
            delta = "" if weights == results[0].weights else f"{row['delta']:+.4f}"
            table.add_row(weights, name if name != "total" else "weighted sum", f"{row['mean']:.4f}", f"{row['std']:.4f}", delta)
        for key, value in entry["extras"].items():
            base = stats[results[0].weights]["extras"].get(key)
            delta = "" if weights == results[0].weights or base is None else f"{value - base:+.4f}"
            table.add_row(weights, key, f"{value:.4f}", "", delta)
    console.print(table)
    console.print(f"per-image scores: {req.out_dir / 'samples.jsonl'}   summary: {req.out_dir / 'summary.json'}"
                  + (f"   images: {req.out_dir / 'images'}" if req.save_images else ""))


@app.command()
def presets() -> None:
    """List the built-in model, family and reward presets and prompt sets."""
    from solrl_core.presets import list_presets
    from solrl_core.prompts import builtin_sets

    with user_errors():
        table = Table(title="solrl presets  (combine as --model M --family F --reward R, or --preset M_F_R)")
        table.add_column("kind")
        table.add_column("name", style="cyan")
        table.add_column("description")
        for p in list_presets():
            table.add_row(p.kind[:-1] if p.kind != "families" else "family", p.name, p.description)
        for name in builtin_sets():
            table.add_row("prompts", name, "built-in prompt set (--prompts NAME)")
        console.print(table)
        console.print(f"precedence: {PRECEDENCE}")


@app.command("config-help")
def config_help() -> None:
    """Every setting `--set section.key=value` accepts, with its default and meaning."""
    from solrl_core.config import help_table

    table = Table(title="settings")
    for col in ("key", "default", "meaning"):
        table.add_column(col)
    for row in help_table():
        table.add_row(*row)
    console.print(table)


def _register_tools() -> None:
    from solrl_cli.compare_cmd import compare
    from solrl_cli.doctor_cmd import doctor
    from solrl_cli.monitor_cmd import monitor

    app.command("doctor")(doctor)
    app.command("monitor")(monitor)
    app.command("compare")(compare)


_register_tools()


def _quiet_third_party() -> None:
    """Library chatter (optional-backend probes, deprecations) is not the user's business."""
    if os.environ.get("SOLRL_DEBUG", "") in ("", "0"):
        # diffusers and transformers reset their loggers' level on import: their own variables win.
        os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        for name in ("torchao", "diffusers", "transformers", "torch.utils._pytree", "peft"):
            logging.getLogger(name).setLevel(logging.ERROR)


def main() -> None:
    _quiet_third_party()
    app()


if __name__ == "__main__":
    main()
