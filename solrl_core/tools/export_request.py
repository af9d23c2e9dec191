"""`solrl export`'s one core function, `export_request`: its options checked before torch loads (one
weight set, --private only with --push-to-hub, a Hub id and token, the output folder, the checkpoint
--best or --checkpoint names), made into the `ExportRequest` that tools/export.py `export_weights`
writes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError
from solrl_core.tools.export_card import check_export_folder, default_folder
from solrl_core.tools.sources import pick_best, tool_config, weight_sets


@dataclass(frozen=True)
class ExportRequest:
    config: Config  # the run's
    checkpoint: Path
    weights: str  # ema or trained
    folder: Path  # checked: new, empty, or an earlier export --overwrite may replace
    chosen: str  # why --best chose the checkpoint, for the model card ('' without --best)


def export_request(run: Path, *, out: Optional[Path] = None, weights: str = "ema", checkpoint: Optional[str] = None,
                   merge: bool = False, model_path: Optional[Path] = None, push_to_hub: Optional[str] = None,
                   private: bool = False, overwrite: bool = False, best: bool = False,
                   say: Callable[[str], None] = lambda line: None) -> ExportRequest:
    """What `solrl export` writes, from its options, each mistake said before anything is written or
    loaded; --best's choice told to `say`."""
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
    checkpoint, why, lines = pick_best(run, checkpoint, best)
    for line in lines:
        say(line)
    cfg, ckpt = tool_config(run, None, model_path, checkpoint)
    folder = out or default_folder(run, ckpt, sets[0], merge)
    if out is None:
        check_export_folder(folder, overwrite)  # an earlier export there: said before the model loads
    return ExportRequest(cfg, ckpt, sets[0], folder, f"chosen by --best: {why}" if why else "")
