"""`solrl export`: a checkpoint's tuned weights in a folder anyone can load and share.

A LoRA export holds the adapter twice, once per library that reads it: diffusers' layout
(`pytorch_lora_weights.safetensors`, for `pipe.load_lora_weights`) and peft's (`adapter_config.json`
with `adapter_model.safetensors`, for `PeftModel.from_pretrained(transformer, folder)`). A merged
export is the transformer with the adapter added to its base weights (`save_pretrained`, no peft
needed). Both get a model card (`README.md`, export_card.py) and permissions others can read: the
LoRA files are written 0600 by safetensors, so every file and folder is set as a new one would be
under this process's umask (0644 and 0755 under the usual 022). Everything is written into a
temporary folder beside the output folder and renamed into place once whole: a failed export (a full
disk) leaves nothing behind, and running it again works; a killed one's temporary folder is removed by
the next export of the same folder. Each export records the files it wrote (`solrl_export.json`), and
`overwrite` replaces those and only those: the new export is written whole first, then each file is
renamed over its old self, and a file or folder the earlier export did not write (a git clone's
`.git/`, your notes) stays as it was.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from solrl_core.config.schema import Config
from solrl_core.engine.policy import LORA_FILE, TRAINED
from solrl_core.tools.export_card import RECORD  # the files an export wrote: all --overwrite replaces

if TYPE_CHECKING:
    from solrl_core.engine.engine import Engine

PEFT_WEIGHTS, PEFT_CONFIG = "adapter_model.safetensors", "adapter_config.json"
_DIFFUSERS_PREFIX, _PEFT_PREFIX = "transformer.", "base_model.model."


@dataclass(frozen=True)
class Exported:
    what: str  # "LoRA" or "merged transformer"
    path: Path  # the folder written
    how: str  # how plain diffusers loads it
    card: Path  # the model card, README.md
    replaced: tuple[str, ...] = ()  # the files of an earlier export --overwrite replaced or removed (relative paths)
    notes: tuple[str, ...] = ()  # what else it did: a killed export's temporary folder removed


def export_merged(engine: Engine, weights: str, out_dir: Path) -> Path:
    """The transformer with the `weights` adapter merged into its base weights, saved with
    diffusers' `save_pretrained` into out_dir/transformer (loadable with the transformer class's
    `from_pretrained`, no peft needed)."""
    import copy

    if weights == "base":
        raise ValueError("the base weights have nothing to merge")
    transformer = engine.model.transformer
    with engine.policy.weights(weights):
        merged = engine.policy.merged_weights(TRAINED)
        plain = {}
        for key, value in transformer.state_dict().items():
            if "lora_" in key:
                continue
            name = key.replace(".base_layer.", ".")
            plain[name] = merged.get(name, value).detach().clone()
    fresh = type(transformer).from_config(copy.deepcopy(dict(transformer.config)))
    missing, unexpected = fresh.load_state_dict(plain, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"merged weights do not fit {type(transformer).__name__}: missing {missing[:3]}, unexpected "
                           f"{unexpected[:3]}")
    target = out_dir / "transformer"
    fresh.to(torch.float32 if engine.dtype == torch.float32 else engine.dtype).save_pretrained(str(target))
    return target


def write_peft_adapter(lora_file: Path, cfg: Config, out_dir: Path) -> Path:
    """peft's files beside diffusers' LoRA file: the same tensors under peft's key names
    ('base_model.model.<module>.lora_A.weight') and the LoraConfig they were trained with, read
    from the LoRA file's own metadata (cfg's LoRA settings where an older file has none)."""
    from peft import LoraConfig
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(lora_file), "pt") as f:
        meta = json.loads((f.metadata() or {}).get("lora_adapter_metadata", "{}"))
        tensors = {_PEFT_PREFIX + k.removeprefix(_DIFFUSERS_PREFIX): f.get_tensor(k) for k in f.keys()}
    settings = {k.removeprefix(_DIFFUSERS_PREFIX): v for k, v in meta.items()}
    if settings:
        lora = LoraConfig.from_peft_type(**settings)
    else:
        from solrl_core.config.choices import LORA_INITS

        m = cfg.model
        lora = LoraConfig(r=m.lora_rank, lora_alpha=m.lora_alpha, init_lora_weights=LORA_INITS[m.lora_init],
                          target_modules=list(m.lora_targets))
    lora.base_model_name_or_path = cfg.model.hub_id or None
    lora.inference_mode = True
    lora.save_pretrained(str(out_dir))
    save_file(tensors, str(out_dir / PEFT_WEIGHTS), metadata={"format": "pt"})
    return out_dir / PEFT_CONFIG


def make_readable(folder: Path) -> None:
    """Every file and folder under `folder` (itself included) given the mode a new one gets under
    this process's umask, as if created by `open` and `mkdir`: safetensors writes 0600."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def remove_partials(out_dir: Path) -> list[str]:
    """The temporary folders earlier exports of `out_dir` left beside it when killed (`.NAME.<rand>.partial`,
    `.NAME.<rand>.old`), removed; a line for each."""
    import glob
    import shutil

    gone = []
    for path in sorted(out_dir.parent.glob(f".{glob.escape(out_dir.name)}.*")) if out_dir.parent.is_dir() else []:
        if path.suffix in (".partial", ".old") and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            gone.append(f"removed {path}, left by an export of {out_dir} that was killed before it finished")
    return gone


def _swap_in(tmp: Path, out_dir: Path) -> list[str]:
    """`tmp`'s files put at `out_dir`: a new or empty `out_dir` is `tmp` renamed; into an earlier export,
    each file is renamed over its old self and the files the earlier export wrote that this one did not
    are deleted, nothing else (export_card.check_export_folder checked that no file of this export would
    replace one it did not write). Returns the files of the earlier export, each replaced or removed."""
    import shutil

    from solrl_core.tools.export_card import recorded_files

    if not out_dir.exists() or not any(out_dir.iterdir()):
        os.rename(tmp, out_dir)  # an empty out_dir is replaced
        return []
    old, new = set(recorded_files(out_dir)), _files(tmp)
    for name in new:
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / name, out_dir / name)
    for name in sorted(old - set(new)):
        (out_dir / name).unlink(missing_ok=True)
    for name in sorted({str(Path(n).parent) for n in old - set(new)}, key=len, reverse=True):
        if name != "." and (out_dir / name).is_dir() and not any((out_dir / name).iterdir()):
            (out_dir / name).rmdir()
    shutil.rmtree(tmp, ignore_errors=True)
    return sorted(old)


def export_weights(cfg: Config, checkpoint: Path, weights: str, out_dir: Path, merge: bool,
                   repo_id: str | None = None, overwrite: bool = False, *, chosen: str = "") -> Exported:
    """A checkpoint's `weights` (ema or trained) written to the empty folder `out_dir`: the LoRA in
    diffusers' and peft's layouts, or with `merge` the whole transformer with the LoRA merged in;
    and a model card naming `repo_id` (where it will be pushed) in its loading code. Written into a
    temporary folder beside `out_dir` and renamed into place once whole, so a failure (a full disk)
    leaves nothing at `out_dir` and the same command can simply be run again. `overwrite`: an earlier
    export at `out_dir` is replaced (export_card.check_export_folder). `chosen`: why this checkpoint
    (--best), for the card."""
    import shutil
    import tempfile

    from solrl_core.faults import disk
    from solrl_core.tools.export_card import check_export_folder

    check_export_folder(out_dir, overwrite)
    notes = remove_partials(out_dir)
    with disk.writing(out_dir.parent, f"the export folder {out_dir.name}"):
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    try:
        what, how, card = _write_export(cfg, checkpoint, weights, tmp, out_dir, merge, repo_id, chosen=chosen)
        (tmp / RECORD).write_text(json.dumps({"files": [*_files(tmp), RECORD]}, indent=1) + "\n")
        make_readable(tmp)
        check_export_folder(out_dir, overwrite, _files(tmp))  # again, now that the export's own files are known
        with disk.writing(out_dir.parent, f"the export folder {out_dir.name}"):
            replaced = _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Exported(what, out_dir, how, out_dir / card.name, tuple(replaced), tuple(notes))


def _write_export(cfg: Config, checkpoint: Path, weights: str, tmp: Path, out_dir: Path, merge: bool,
                  repo_id: str | None, *, chosen: str = "") -> tuple[str, str, Path]:
    """The export's files into `tmp` (errors name `out_dir`, the folder the user asked for): what was
    written, how plain diffusers loads it from `out_dir`, and the model card."""
    import shutil

    from solrl_core.faults import disk
    from solrl_core.tools.export_card import CardFacts, builtin_code, write_card

    run_dir = checkpoint.parent.parent
    if merge:
        from solrl_core.engine.engine import open_engine

        engine = open_engine(cfg, checkpoint=checkpoint)
        with disk.writing(out_dir, "the merged transformer"):
            path = export_merged(engine, weights, tmp)
        cls = json.loads((path / "config.json").read_text())["_class_name"]
        what, how = "merged transformer", f"diffusers' {cls}.from_pretrained('{out_dir}', subfolder='transformer')"
    else:
        source = checkpoint / LORA_FILE if weights == "trained" else checkpoint / "ema" / LORA_FILE
        with disk.writing(out_dir, LORA_FILE):
            shutil.copyfile(source, tmp / LORA_FILE)
            write_peft_adapter(tmp / LORA_FILE, cfg, tmp)
        cls, what = "", "LoRA"
        how = f"pipe.load_lora_weights('{out_dir}'), or peft's PeftModel.from_pretrained(transformer, '{out_dir}')"
    facts = CardFacts.of(cfg, run_dir, checkpoint, weights, merge, repo_id, cls, chosen=chosen)
    if facts.builtin:  # the tiny models: solrl's own loader, as the card shows it
        how = "solrl's own loader (no diffusers pipeline):\n" + "\n".join(f"    {line}"
                                                                          for line in builtin_code(facts, str(out_dir)))
    with disk.writing(out_dir, "README.md"):
        card = write_card(tmp, facts)
    return what, how, card
