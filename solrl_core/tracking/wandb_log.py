"""Weights & Biases: one W&B run per solrl run, resumed with it.

W&B's own environment decides where and how: WANDB_PROJECT (default "solrl"), WANDB_DIR (default
the run folder), WANDB_MODE (offline writes RUN/wandb/offline-run-*; `wandb sync` uploads it later),
WANDB_ENTITY, WANDB_API_KEY. The W&B run id is kept in RUN/wandb_run.json, so `--resume` continues
the same W&B run and its series; beside it, the run's URL, or for an offline run the folder that
`wandb sync` uploads (`tracking.where` says both when the run starts). A video model's sample clips
go to `samples/video` as a wandb.Video of the clip file beside the contact-sheet grid.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from solrl_core import events as ev
from solrl_core.errors import SolrlError
from solrl_core.tracking.base import Tracker, caption

ID_FILE = "wandb_run.json"


def _saved_id(id_file: Path) -> str:
    """The W&B run id a resumed run continues: a short plain string, or one line naming the file."""
    try:
        run_id = json.loads(id_file.read_text(encoding="utf-8"))["id"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError) as exc:
        raise SolrlError(f"{id_file} is unreadable ({type(exc).__name__}: {exc})",
                         f"delete it to log the resumed run as a new W&B run (rm {id_file})") from exc
    if not isinstance(run_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", run_id):
        raise SolrlError(f"{id_file} holds no W&B run id (letters, digits, - and _)",
                         f"delete it to log the resumed run as a new W&B run (rm {id_file})")
    return run_id


class WandbLog(Tracker):
    def __init__(self, run_dir: Path, config: dict[str, Any], resumed: bool) -> None:
        import wandb

        run_dir = Path(run_dir)
        id_file = run_dir / ID_FILE
        run_id = _saved_id(id_file) if resumed and id_file.is_file() else None
        folder = os.environ.get("WANDB_DIR") or str(run_dir)
        Path(folder).mkdir(parents=True, exist_ok=True)
        # console="off": W&B would otherwise wrap stdout, which the terminal display and TUI own
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "solrl", dir=folder, name=run_dir.name,
                                  id=run_id,
                                  resume="allow" if run_id else None, config=config,
                                  settings=wandb.Settings(console="off", silent=True))
        except Exception as exc:  # noqa: BLE001 - no key, no network, a bad entity: W&B's own words, one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SolrlError(f"W&B could not start a run: {first}", "run `wandb login` or set WANDB_API_KEY; "
                             "WANDB_MODE=offline logs locally (upload later with `wandb sync`)") from exc
        offline = bool(getattr(self.run, "offline", False))  # (reading .url of an offline run prints a W&B warning)
        where = {"offline_dir": str(Path(self.run.settings.sync_dir).resolve())} if offline else {"url": self.run.url}
        id_file.write_text(json.dumps({"id": self.run.id, "project": self.run.project, **where}), encoding="utf-8")
        self._wandb = wandb

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def image(self, grid: ev.SampleGrid) -> None:
        text = caption(grid)
        media = {"samples": self._wandb.Image(grid.path, caption=text)}
        if grid.video:
            media["samples/video"] = self._wandb.Video(grid.video, caption=text)
        self.run.log(media, step=grid.iteration)

    def close(self, reason: str) -> None:
        self.run.finish(exit_code=0 if reason in ("completed", "interrupted") else 1)
