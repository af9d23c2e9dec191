"""`solrl infer` (images from fixed seeds, base beside tuned) and `solrl export` (a run's weights
for plain diffusers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from solrl_cli import options as opt
from solrl_cli.common import console, output_folder, pick_best, prompt_texts, tool_config, weight_sets
from solrl_cli.errors import user_errors
from solrl_core.text import plural

InferRun = Annotated[Optional[Path], typer.Argument(help="A run folder: images from its checkpoint next to the base model's. Omit for a base model alone.")]
Seeds = Annotated[int, typer.Option("--seeds", min=1, help="Images per prompt, from seeds SEED..SEED+n-1.")]
FirstSeed = Annotated[int, typer.Option("--seed", help="First seed.")]
Grid = Annotated[bool, typer.Option("--grid/--no-grid", help="Write grid.png: one row per (prompt, seed), one column per weight set.")]
ExportRun = Annotated[Path, typer.Argument(help="A run folder.")]
ExportOut = Annotated[Optional[Path], typer.Option("--out", "-o", help="Folder to write (new or empty). Default: RUN/export/<checkpoint>-<weights>[-merged], e.g. RUN/export/iter_000300-ema.")]
PushToHub = Annotated[Optional[str], typer.Option(
    "--push-to-hub", metavar="REPO", help="Also upload the export to this Hugging Face Hub model repo (OWNER/NAME, created if "
                                          "missing; HF_ENDPOINT is honoured). Token: HF_TOKEN, else `hf auth login`'s.")]
Private = Annotated[bool, typer.Option("--private", help="With --push-to-hub: create the repo private.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace the files an earlier export in the folder wrote (its solrl_export.json lists them); every other file stays.")]
Merge = Annotated[bool, typer.Option("--merge", help="Write the full transformer with the LoRA merged in, instead of the LoRA alone.")]


def infer(
    run: InferRun = None, prompt: opt.Prompt = None, prompts: opt.Prompts = None, model: opt.Model = None,
    model_path: opt.ModelPath = None, seeds: Seeds = 2, seed: FirstSeed = 0, steps: opt.EvalSteps = None,
    weights: opt.Weights = "ema", checkpoint: opt.Checkpoint = None, out: opt.Out = None, grid: Grid = True,
    set_: opt.Sets = None, device: opt.Device = None,
) -> None:
    """Generate images from fixed seeds with the base model and a run's tuned weights, side by side."""
    with user_errors():
        engine, req, ckpt = infer_request(run, prompt=prompt, prompts=prompts, model=model, model_path=model_path, seeds=seeds,
                                          seed=seed, steps=steps, weights=weights, checkpoint=checkpoint, out=out, grid=grid,
                                          sets=set_, device=device)
        from solrl_cli.display import TerminalDisplay
        from solrl_core import events
        from solrl_core.tools.inference import infer as run_infer

        cfg, texts = engine.config, req.prompts
        count = len(texts) * seeds * len(req.weights)
        console.print(f"solrl infer  {ckpt or cfg.model.name + ' (base)'}  {plural(len(texts), 'prompt')} x {plural(seeds, 'seed')}  "
                      f"steps {req.steps}  weights {', '.join(req.weights)}: {plural(count, 'clip' if engine.model.media == 'video' else 'image')}")
        if not prompt:  # the user named no prompt: say where these come from, and how to ask for fewer
            console.print(f"  prompts: {prompts or cfg.run.eval_prompts or cfg.run.prompts} (no --prompt given; "
                          "--prompt TEXT for your own, --seeds N for fewer a prompt)")
        bus = events.EventBus()
        bus.subscribe(TerminalDisplay(console))
        rows = run_infer(engine, req, bus)
        what = "clips" if engine.model.media == "video" else "images"
        console.print(f"{what}: {req.out_dir}   index: {rows}" + (f"   grid: {req.out_dir / 'grid.png'}" if grid else ""))


def infer_request(run: Optional[Path], *, prompt: Optional[list[str]] = None, prompts: Optional[str] = None,
                  model: Optional[str] = None, model_path: Optional[Path] = None, seeds: int = 2, seed: int = 0,
                  steps: Optional[int] = None, weights: str = "ema", checkpoint: Optional[str] = None,
                  out: Optional[Path] = None, grid: bool = True, sets: Optional[list[str]] = None,
                  device: Optional[str] = None):  # noqa: ANN201
    """What `solrl infer` (and `solrl.infer`) draws, from its options: the engine of RUN's checkpoint (or
    of a base model), the request (prompts checked against the model's words) and the checkpoint."""
    from solrl_core.data.words import check_words, known_words

    tuned = weight_sets(weights)
    cfg, ckpt = tool_config(run, model, model_path, checkpoint, sets=sets, flags={"run": {"device": device}})
    texts = prompt_texts(prompt, prompts, cfg.run.eval_prompts or cfg.run.prompts)
    check_words(known_words(cfg.model.loader, cfg.model.weights), texts)  # a tiny model's words, from its folder: in a second
    from solrl_core.engine.engine import open_engine  # torch: only once the inputs are checked
    from solrl_core.tools.inference import InferRequest, check_vocabulary

    engine = open_engine(cfg, checkpoint=ckpt)
    check_vocabulary(engine.model, texts)  # a vocabulary known only once loaded: before anything is written
    req = InferRequest(prompts=texts, seeds=list(range(seed, seed + seeds)), weights=("base", *tuned) if ckpt else ("base",),
                       steps=steps or cfg.sampler.eval_steps, out_dir=output_folder(out, run, "infer"), grid=grid)
    return engine, req, ckpt


def export(
    run: ExportRun, out: ExportOut = None, weights: Annotated[str, typer.Option("--weights", help="ema or trained.")] = "ema",
    checkpoint: opt.Checkpoint = None, merge: Merge = False, model_path: opt.ModelPath = None,
    push_to_hub: PushToHub = None, private: Private = False, overwrite: Overwrite = False, best: opt.Best = False,
) -> None:
    """Export a run's tuned weights with a model card: the LoRA for diffusers and peft, or (--merge) a merged transformer."""
    from solrl_core.errors import SolrlError
    from solrl_core.tools.export_card import check_export_folder, default_folder

    with user_errors():
        sets = weight_sets(weights)
        if len(sets) != 1:
            raise SolrlError("--weights takes one weight set for export", "--weights ema or --weights trained")
        if private and not push_to_hub:
            raise SolrlError("--private is for --push-to-hub", "add --push-to-hub OWNER/NAME, or drop --private")
        if push_to_hub:
            from solrl_core.tools.hub import check_push

            check_push(push_to_hub)  # a bad id or no token: said before anything is written
        if out is not None:
            check_export_folder(out, overwrite)
        checkpoint, why = pick_best(run, checkpoint, best)
        cfg, ckpt = tool_config(run, None, model_path, checkpoint)
        folder = out or default_folder(run, ckpt, sets[0], merge)
        if out is None:
            check_export_folder(folder, overwrite)  # an earlier export there: said before the model loads
        from solrl_core.tools.export import export_weights  # torch: only once the inputs are checked

        exported = export_weights(cfg, ckpt, sets[0], folder, merge, push_to_hub, overwrite,
                                  chosen=f"chosen by --best: {why}" if why else "")
        for note in exported.notes:
            console.print(f"note: {note}")
        console.print(f"{exported.what} ({sets[0]} weights of {ckpt.name}) -> {exported.path}  (model card {exported.card.name}; "
                      f"load with {exported.how})")
        if exported.replaced:
            console.print(f"--overwrite replaced the earlier export's {plural(len(exported.replaced), 'file')} "
                          f"({', '.join(exported.replaced)}); every other file in {exported.path} is as it was")
        if push_to_hub:
            from solrl_core.tools.hub import push_folder

            url = push_folder(exported.path, push_to_hub, private, f"solrl export: {sets[0]} weights of {run.resolve().name}/{ckpt.name}")
            console.print(f"pushed to {url}")
