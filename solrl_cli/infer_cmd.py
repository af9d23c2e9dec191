"""`solrl infer` (images from fixed seeds, base beside tuned) and `solrl export` (a run's weights
for plain diffusers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from solrl_cli import options as opt
from solrl_cli.common import console
from solrl_cli.errors import user_errors
from solrl_core.text import plural

InferRun = Annotated[Optional[Path], typer.Argument(help="A run folder: images from its checkpoint next to the base "
                                                         "model's. Omit for a base model alone.")]
Seeds = Annotated[int, typer.Option("--seeds", min=1, help="Images per prompt, from seeds SEED..SEED+n-1.")]
FirstSeed = Annotated[int, typer.Option("--seed", help="First seed.")]
Grid = Annotated[bool, typer.Option("--grid/--no-grid", help="Write grid.png: one row per (prompt, seed), one column "
                                                             "per weight set.")]
ExportRun = Annotated[Path, typer.Argument(help="A run folder.")]
ExportOut = Annotated[Optional[Path], typer.Option("--out", "-o", help="Folder to write (new or empty). Default: "
                                                                       "RUN/export/<checkpoint>-<weights>[-merged], "
                                                                       "e.g. RUN/export/iter_000300-ema.")]
PushToHub = Annotated[Optional[str], typer.Option(
    "--push-to-hub", metavar="REPO", help="Also upload the export to this Hugging Face Hub model repo (OWNER/NAME, "
                                          "created if missing; HF_ENDPOINT is honoured). Token: HF_TOKEN, else `hf "
                                          "auth login`'s.")]
Private = Annotated[bool, typer.Option("--private", help="With --push-to-hub: create the repo private.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace the files an earlier export in the folder wrote "
                                                             "(its solrl_export.json lists them); every other file "
                                                             "stays.")]
Merge = Annotated[bool, typer.Option("--merge", help="Write the full transformer with the LoRA merged in, instead of "
                                                     "the LoRA alone.")]


def infer(
    run: InferRun = None, prompt: opt.Prompt = None, prompts: opt.Prompts = None, model: opt.Model = None,
    model_path: opt.ModelPath = None, seeds: Seeds = 2, seed: FirstSeed = 0, steps: opt.EvalSteps = None,
    weights: opt.Weights = "ema", checkpoint: opt.Checkpoint = None, out: opt.Out = None, grid: Grid = True,
    set_: opt.Sets = None, device: opt.Device = None,
) -> None:
    """Generate images from fixed seeds with the base model and a run's tuned weights, side by side."""
    with user_errors():
        from solrl_core.tools.inference import infer_request

        engine, req, ckpt = infer_request(run, prompt=prompt, prompts=prompts, model=model, model_path=model_path,
                                          seeds=seeds,
                                          seed=seed, steps=steps, weights=weights, checkpoint=checkpoint, out=out,
                                          grid=grid,
                                          sets=set_, device=device)
        from solrl_view.display import TerminalDisplay
        from solrl_core import events
        from solrl_core.tools.inference import infer as run_infer

        cfg, texts = engine.config, req.prompts
        count = len(texts) * seeds * len(req.weights)
        console.print(f"solrl infer  {ckpt or cfg.model.name + ' (base)'}  {plural(len(texts), 'prompt')} x "
                      f"{plural(seeds, 'seed')}  steps {req.steps}  weights {', '.join(req.weights)}: "
                      f"{plural(count, 'clip' if engine.model.media == 'video' else 'image')}")
        if not prompt:  # the user named no prompt: say where these come from, and how to ask for fewer
            console.print(f"  prompts: {prompts or cfg.run.eval_prompts or cfg.run.prompts} (no --prompt given; "
                          "--prompt TEXT for your own, --seeds N for fewer a prompt)")
        bus = events.EventBus()
        bus.subscribe(TerminalDisplay(console))
        rows = run_infer(engine, req, bus)
        what = "clips" if engine.model.media == "video" else "images"
        console.print(f"{what}: {req.out_dir}   index: {rows}"
                      + (f"   grid: {req.out_dir / 'grid.png'}" if grid else ""))


def export(
    run: ExportRun, out: ExportOut = None,
           weights: Annotated[str, typer.Option("--weights", help="ema or trained.")] = "ema",
    checkpoint: opt.Checkpoint = None, merge: Merge = False, model_path: opt.ModelPath = None,
    push_to_hub: PushToHub = None, private: Private = False, overwrite: Overwrite = False, best: opt.Best = False,
) -> None:
    """Export a run's tuned weights with a model card: the LoRA for diffusers and peft, or (--merge) a merged
    transformer."""
    with user_errors():
        from solrl_core.tools.export_request import export_request

        req = export_request(run, out=out, weights=weights, checkpoint=checkpoint, merge=merge,
                             model_path=model_path, push_to_hub=push_to_hub, private=private, overwrite=overwrite,
                             best=best, say=console.print)
        from solrl_core.tools.export import export_weights  # torch: only once the inputs are checked

        exported = export_weights(req.config, req.checkpoint, req.weights, req.folder, merge, push_to_hub, overwrite,
                                  chosen=req.chosen)
        sets, ckpt = (req.weights,), req.checkpoint
        for note in exported.notes:
            console.print(f"note: {note}")
        console.print(f"{exported.what} ({sets[0]} weights of {ckpt.name}) -> {exported.path}  (model card "
                      f"{exported.card.name}; load with {exported.how})")
        if exported.replaced:
            console.print(f"--overwrite replaced the earlier export's {plural(len(exported.replaced), 'file')} "
                          f"({', '.join(exported.replaced)}); every other file in {exported.path} is as it was")
        if push_to_hub:
            from solrl_core.tools.hub import push_folder

            url = push_folder(exported.path, push_to_hub, private, f"solrl export: {sets[0]} weights of "
                                                                   f"{run.resolve().name}/{ckpt.name}")
            console.print(f"pushed to {url}")
