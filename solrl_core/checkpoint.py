"""Checkpoints that survive a crash at any instant.

A checkpoint is a folder `checkpoints/iter_NNNNNN/` written under a temporary name and renamed into
place, so a folder with that name is always complete. It holds the trained adapter in diffusers'
LoRA format (`pytorch_lora_weights.safetensors`, loadable with `pipe.load_lora_weights`), the old
and EMA adapters in the same format under `old/` and `ema/`, the optimizer, the loop state and the
RNG states. The newest complete folder is the one `--resume` continues from.

Nothing in it depends on the number of processes: the adapters and the optimizer state of the LoRA
parameters are replicated on every rank, and the RNG states are rank 0's (the one process that
writes). Every random draw of an iteration derives from (run seed, iteration) anyway, so a run
saved on 8 GPUs resumes on 1, or on 4, and draws the same prompts, seeds and noise.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from solrl_core.errors import SolrlError
from solrl_core.policy import LORA_FILE, OLD, TRAINED, Policy

_NAME = re.compile(r"^iter_(\d{6})$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and _NAME.match(p.name))


def save_checkpoint(run_dir: Path, iteration: int, policy: Policy, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint `iteration` atomically and prune all but the newest `keep`."""
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"iter_{iteration:06d}"
    tmp = folder / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        policy.save_lora(tmp, TRAINED)
        policy.save_lora(tmp / "old", OLD)
        policy.save_lora(tmp / "ema", "ema")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}, tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
        _fsync_tree(tmp)
        if final.exists():  # the same iteration saved again after a resume: swap, never half-replace
            stale = folder / f".old-{final.name}-{time.monotonic_ns()}"
            final.rename(stale)
            tmp.rename(final)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())


def load_adapters(path: Path, policy: Policy) -> None:
    """The trained, old and EMA adapters of a checkpoint into `policy` (for resume, eval and infer)."""
    try:
        for adapter, sub in ((TRAINED, path), (OLD, path / "old"), ("ema", path / "ema")):
            tensors = load_file(str(sub / LORA_FILE))
            policy.load_state(adapter, {k.removeprefix("transformer."): v for k, v in tensors.items()})
    except SolrlError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read means the checkpoint cannot be trusted
        raise SolrlError(f"checkpoint {path} is unreadable or corrupt: {type(exc).__name__}: {exc}",
                         "delete that folder to resume from the previous checkpoint") from exc


def load_checkpoint(path: Path, policy: Policy, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore adapters, optimizer and RNG states; return the loop state. Corruption is a clear error."""
    load_adapters(path, policy)
    try:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
        rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=False)
        state = json.loads((path / "trainer_state.json").read_text())
    except Exception as exc:  # noqa: BLE001 - any failure to read means the checkpoint cannot be trusted
        raise SolrlError(f"checkpoint {path} is unreadable or corrupt: {type(exc).__name__}: {exc}",
                         "delete that folder to resume from the previous checkpoint") from exc
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state
