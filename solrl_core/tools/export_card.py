"""The model card (`README.md`) of an export: what was tuned, how, how well, and how to load it.

Its YAML front matter is what the Hugging Face Hub reads (base_model, library_name, license, tags),
written by huggingface_hub's `ModelCardData`; its evaluation table comes from the run's own
`events.jsonl` (the base evaluation before the first iteration and the newest EMA evaluation at or
before the exported checkpoint, each change with the paired standard error the run recorded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError

HUB_HINT = "pip install huggingface_hub"


@dataclass(frozen=True)
class EvalTable:
    """Base against tuned on the same (prompt, seed) pairs: rows of (name, base, tuned, s.e. or None)."""

    prompts: str
    samples: int
    iteration: int  # of the tuned evaluation
    weights: str  # the weights it scored (ema)
    rows: list[tuple[str, float, float, float | None]] = field(default_factory=list)


@dataclass(frozen=True)
class CardFacts:
    """Everything the card says, gathered from the run's config, checkpoint and events."""

    base_model: str  # hub id, '' when the base is a local folder or the built-in tiny model
    base_label: str  # how the card names the base
    pipeline: str  # diffusers pipeline class that loads the base; '' for solrl's built-in models, which have none
    family: str
    rewards: dict[str, float]
    iteration: int
    planned: int
    prompts: str
    lora: dict[str, object]
    weights: str
    merged: bool
    repo_id: str | None
    transformer_class: str
    license: dict[str, str]  # the base model's license fields, {} when unknown
    evaluation: EvalTable | None
    builtin: str = ""  # a built-in model's loading call: resolve_config's arguments that rebuild it (`_builtin_call`)
    # which checkpoint and why: --best's reason, or its evaluation's hacking verdict; '' for neither
    checkpoint: str = ""

    @classmethod
    def of(cls, cfg: Config, run_dir: Path, checkpoint: Path, weights: str, merged: bool, repo_id: str | None,
           transformer_class: str = "", *, chosen: str = "") -> CardFacts:
        from solrl_core.models.layouts import LAYOUTS  # torch: not for check_export_folder, which runs before it loads

        m = cfg.model
        label = m.hub_id or (f"{m.name} (local folder {m.path})" if m.path else f"{m.name} (solrl's built-in model)")
        from solrl_core.engine.state_schema import TRAINER_STATE, read_trainer_state

        state = checkpoint / TRAINER_STATE
        iteration = (read_trainer_state(checkpoint)["iteration"] if state.is_file()
                     else int(checkpoint.name.split("_")[-1]))
        lora = {"rank": m.lora_rank, "alpha": m.lora_alpha, "init": m.lora_init, "targets": list(m.lora_targets)}
        return cls(m.hub_id, label, _pipeline(m.loader), cfg.algorithm.family, dict(cfg.reward.weights), iteration,
                   cfg.run.iterations, cfg.run.prompts, lora, weights, merged, repo_id, transformer_class,
                   base_license(m.hub_id, m.path), eval_table(run_dir, iteration),
                   "" if m.loader in LAYOUTS else _builtin_call(cfg), chosen or _verdict(checkpoint))


def _verdict(checkpoint: Path) -> str:
    """A flagged checkpoint says so on its card (loop/hacking.py); a clean or unevaluated one says nothing."""
    from solrl_core.loop.hacking import Verdicts

    verdict = Verdicts(checkpoint.parent.parent).of(checkpoint)[0] if (checkpoint
                                                                       / "trainer_state.json").is_file() else None
    if verdict is None or not verdict["flagged"]:  # a verdict the run's events do not bear out is not repeated
        return ""
    return (f"{checkpoint.name}, whose evaluation the reward-hacking rule flagged ({', '.join(verdict['flagged'])} "
            f"fell while the trained reward rose): `solrl export RUN --best` picks the best checkpoint it passed")


def _pipeline(loader: str) -> str:
    from solrl_core.models.layouts import LAYOUTS

    # tiny and tiny_video: no diffusers pipeline builds them
    return LAYOUTS[loader].pipeline if loader in LAYOUTS else ""


def _builtin_call(cfg: Config) -> str:
    """resolve_config's arguments that rebuild a built-in model as the run built it: its preset, and
    the model settings the run changed from it."""
    from dataclasses import asdict

    from solrl_core.config.presets import resolve_config

    preset = resolve_config(cfg.model.name).model
    changed = {k: v for k, v in asdict(cfg.model).items() if v != getattr(preset, k)}
    return repr(cfg.model.name) + (f", flags={{'model': {changed!r}}}" if changed else "")


def eval_table(run_dir: Path, iteration: int) -> EvalTable | None:
    """The run's base evaluation against its newest EMA evaluation at or before `iteration`, from
    events.jsonl; None when the run evaluated no such pair (or has no readable events)."""
    from solrl_core.tracking.compare import load_run

    try:
        evals = [t.event for t in load_run(run_dir).evals]
    except SolrlError:
        return None
    bases = [e for e in evals if e.weights == "base"]
    tuned = [e for e in evals if e.weights != "base" and 0 < e.iteration <= iteration]
    if not bases or not tuned:
        return None
    base, last = bases[-1], max(tuned, key=lambda e: e.iteration)
    se = last.delta_se
    rows = [("reward", base.mean, last.mean, se.get("mean"))]
    if len(last.components) > 1:
        rows += [(k, base.components[k], v, None) for k, v in last.components.items() if k in base.components]
    rows += [(k, base.extras[k], v, se.get(k)) for k, v in last.extras.items() if k in base.extras]
    # run.eval_rewards: scored, never trained on
    rows += [(f"{k} (eval only)", base.eval_rewards[k], v, last.eval_se.get(k))
             for k, v in last.eval_rewards.items() if k in base.eval_rewards]
    return EvalTable(last.prompts, last.samples, last.iteration, last.weights, rows)


def base_license(hub_id: str, path: str) -> dict[str, str]:
    """The base model's license fields (license, and license_name and license_link where its card
    has them), from its card when one is on this machine (the local folder's, or the hub cache's
    README.md); empty when unknown. Never asks the network."""
    try:
        from huggingface_hub import ModelCard, try_to_load_from_cache
    except ImportError:
        return {}
    candidates = [Path(path) / "README.md"] if path else []
    if hub_id:
        cached = try_to_load_from_cache(hub_id, "README.md")
        candidates += [Path(cached)] if isinstance(cached, str) else []
    for readme in candidates:
        try:
            data = ModelCard.load(readme).data.to_dict() if readme.is_file() else {}
        except (ValueError, OSError):
            data = {}
        if data.get("license"):
            return {k: str(data[k]) for k in ("license", "license_name", "license_link") if data.get(k)}
    return {}


def _evaluation(facts: CardFacts) -> list[str]:
    table = facts.evaluation
    if table is None:
        return ["Not evaluated: the run recorded no evaluation of the base and tuned weights "
                "(`--set run.eval_prompts=NAME` evaluates during training; `solrl eval RUN` afterwards)."]
    lines = [f"On `{table.prompts}` ({table.samples} images: fixed prompt and seed pairs, the same for both "
             f"columns), the base model against the run's {table.weights} weights at iteration {table.iteration}. "
             "Each change carries the paired standard error over the images where the run recorded one.", ""]
    if facts.weights != table.weights or table.iteration != facts.iteration:
        lines += [f"This export holds the {facts.weights} weights of iteration {facts.iteration}: "
                  f"not the weights measured here.", ""]
    lines += ["| metric | base | tuned | change |", "|---|---|---|---|"]
    for name, base, tuned, se in table.rows:
        change = f"{tuned - base:+.4f}" + (f" ± {se:.4f}" if se is not None else "")
        lines.append(f"| {name} | {base:.4f} | {tuned:.4f} | {change} |")
    return lines


def _builtin_usage(facts: CardFacts, where: str) -> list[str]:
    """A built-in model (tiny, tiny_video) has no diffusers pipeline: solrl builds it from its config."""
    head = ["solrl builds the base model (no diffusers pipeline loads it); "
            + ("the transformer here has the LoRA merged in:" if facts.merged else "peft puts the LoRA on its "
                                                                                   "transformer:"),
            "", "```python"]
    return [*head, *builtin_code(facts, where), "```", "", "`solrl infer RUN` draws images with the run's weights "
                                                           "beside the base model's."]


def builtin_code(facts: CardFacts, where: str) -> list[str]:
    """The Python that loads a built-in model with the export at `where` (the card shows it, and `solrl
    export` prints it: `pipe.load_lora_weights` has no pipeline to call here)."""
    code = ["import torch", f"from diffusers import {facts.transformer_class}" if facts.merged else "from peft import "
                                                                                                    "PeftModel",
            "from solrl_core.config.presets import resolve_config", "from solrl_core.models import load_model",
            f"model = load_model(resolve_config({facts.builtin}).model, torch.device('cpu'), torch.float32)"]
    if facts.merged:
        return [*code, f'model.transformer = {facts.transformer_class}.from_pretrained("{where}", '
                       f'subfolder="transformer")']
    return [*code, f'model.transformer = PeftModel.from_pretrained(model.transformer, "{where}")']


def _usage(facts: CardFacts) -> list[str]:
    where = facts.repo_id or "path/to/this/folder"
    if facts.builtin:
        return _builtin_usage(facts, where)
    base = facts.base_model or "path/to/the/base/model"
    note = [] if facts.base_model else [f"# the base model, {facts.base_label}, is not a hub repo: give its folder"]
    if facts.merged:
        cls = facts.transformer_class or "SanaTransformer2DModel"
        return ["The transformer with the LoRA merged in; no peft needed:", "", "```python", *note, "import torch",
                f"from diffusers import {facts.pipeline}, {cls}", "",
                f'transformer = {cls}.from_pretrained("{where}", subfolder="transformer", torch_dtype=torch.bfloat16)',
                f'pipe = {facts.pipeline}.from_pretrained("{base}", transformer=transformer, '
                f'torch_dtype=torch.bfloat16)',
                "```"]
    return ["With diffusers (`pytorch_lora_weights.safetensors`):", "", "```python", *note, "import torch",
            f"from diffusers import {facts.pipeline}", "",
            f'pipe = {facts.pipeline}.from_pretrained("{base}", torch_dtype=torch.bfloat16)',
            f'pipe.load_lora_weights("{where}")', "```", "",
            "With peft (`adapter_config.json`, `adapter_model.safetensors`):", "", "```python",
            "from peft import PeftModel", "",
            f'transformer = PeftModel.from_pretrained(pipe.transformer, "{where}")  # pipe loaded as above, no LoRA',
            "```"]


def render(facts: CardFacts) -> str:
    """The card's markdown body (without front matter)."""
    rewards = ", ".join(f"`{k}` (weight {v:g})" for k, v in facts.rewards.items())
    lora = facts.lora
    kind = "transformer with a LoRA merged in" if facts.merged else "LoRA"
    lines = [f"# {facts.base_label}: {kind} tuned with solrl ({facts.family})", "",
             f"Post-trained with reinforcement learning by solrl (family `{facts.family}`) on the reward {rewards}.",
             "",
             "| | |", "|---|---|",
             f"| base model | {facts.base_label} |",
             f"| reward | {rewards} |",
             f"| family | `{facts.family}` |",
             f"| iterations | {facts.iteration} (of {facts.planned} planned) |",
             f"| training prompts | `{facts.prompts}` |",
             f"| weights | {facts.weights} |",
             f"| LoRA | rank {lora['rank']}, alpha {lora['alpha']}, init {lora['init']} |",
             f"| LoRA targets | {', '.join(f'`{t}`' for t in lora['targets'])} |",
             *([f"| checkpoint | {facts.checkpoint} |"] if facts.checkpoint else []), "",
             "## Evaluation", "", *_evaluation(facts), "", "## How to load it", "", *_usage(facts), "",
             "## License", ""]
    if facts.license:
        named = facts.license.get("license_name", facts.license["license"])
        link = f" ({facts.license['license_link']})" if "license_link" in facts.license else ""
        lines.append(f"The base model's license is `{named}`{link}; these weights derive from it and follow its terms.")
    else:
        lines.append("The base model's license was not found on the machine that exported this; these weights derive "
                     "from the base model and follow its terms (see its model card).")
    return "\n".join(lines) + "\n"


def is_export(folder: Path) -> bool:
    """Whether `folder` holds an export: a model card whose front matter carries the solrl tag (write_card)."""
    card = folder / "README.md"
    if not card.is_file():
        return False
    head = card.read_text(encoding="utf-8", errors="replace")[:4000].split("\n---", 1)[0]
    return head.startswith("---") and "\n- solrl\n" in head


def default_folder(run_dir: Path, checkpoint: Path, weights: str, merge: bool) -> Path:
    """Where an export goes without --out: RUN/export/<checkpoint>-<weights>[-merged]."""
    return run_dir / "export" / f"{checkpoint.name}-{weights}{'-merged' if merge else ''}"


RECORD = "solrl_export.json"  # written by export.py: the files an export wrote, all --overwrite replaces


def recorded_files(folder: Path) -> list[str]:
    """The files an earlier export at `folder` recorded writing (relative paths inside it), checked: a
    record that is not a list of plain relative paths, or that names a link, is refused in one line."""
    import json
    import posixpath

    from solrl_core.faults.links import check_path

    path = check_path(folder, RECORD, what="the export folder")
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"] if path.stat().st_size < 1 << 20 else None
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        files = None
    if not isinstance(files, list) or not all(isinstance(f, str) and f and not f.startswith("/") and
                                              posixpath.normpath(f) == f and not f.startswith("..") for f in files):
        raise SolrlError(f"{path} is not a record solrl wrote (a list of the export's files)",
                         "choose a new --out folder, or delete the earlier export's files by hand")
    for name in files:
        check_path(folder, *name.split("/"), what="the export folder")  # a link there is refused, never followed
    return files


def check_export_folder(out_dir: Path, overwrite: bool = False, writes: list[str] | None = None) -> None:
    """An export's folder is new or empty, or (`overwrite`) holds an earlier export whose record
    (solrl_export.json) names the files it wrote: --overwrite replaces those alone, and refuses when a
    file of the new export (`writes`, once known) would replace one the earlier export did not write."""
    from solrl_core.io.rundir import check_empty_folder

    if out_dir.is_dir() and not out_dir.is_symlink() and is_export(out_dir):
        if not overwrite:
            raise SolrlError(f"{out_dir} already holds an export", "add --overwrite to replace it, or choose a new "
                                                                   "--out folder")
        if not (out_dir / RECORD).exists():
            raise SolrlError(f"{out_dir} holds an export without {RECORD} (the record of the files an export wrote, "
                             "kept since this version): --overwrite cannot tell its files from yours",
                             "choose a new --out folder, or delete the earlier export's files there by hand")
        ours = set(recorded_files(out_dir))
        foreign = sorted(n for n in writes or [] if n not in ours and (out_dir / n).exists())
        if foreign:
            raise SolrlError(f"{out_dir / foreign[0]} was not written by an earlier export: --overwrite would replace "
                             f"it",
                             "move it away, or choose a new --out folder")
        return
    check_empty_folder(out_dir)


def write_card(out_dir: Path, facts: CardFacts) -> Path:
    """README.md in out_dir: hub front matter (huggingface_hub's ModelCardData) and the body."""
    try:
        from huggingface_hub import ModelCard, ModelCardData
    except ImportError as exc:
        raise SolrlError("the model card needs huggingface_hub, which is not installed", HUB_HINT) from exc
    tags = ["solrl", facts.family, "text-to-image", "diffusers"] + ([] if facts.merged else ["lora"])
    data = ModelCardData(base_model=facts.base_model or None, library_name="diffusers", pipeline_tag="text-to-image",
                         tags=tags, **facts.license)
    path = out_dir / "README.md"
    ModelCard(f"---\n{data.to_yaml()}\n---\n\n{render(facts)}").save(path)
    return path
