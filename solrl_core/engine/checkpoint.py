"""Checkpoints that survive a crash at any instant.

A checkpoint is a folder `checkpoints/iter_NNNNNN/` written under a temporary name and renamed into
place, so a folder with that name is always complete. It holds the trained adapter in diffusers'
LoRA format (`pytorch_lora_weights.safetensors`, loadable with `pipe.load_lora_weights`), the old
and EMA adapters in the same format under `old/` and `ema/`, the optimizer, the loop state and the
RNG states (tensors and JSON: nothing in a checkpoint is a pickle, faults/state_files.py), and last a `manifest.json`
with every file's size and SHA-256 (faults/manifest.py).
`--resume` continues from the newest folder, after checking it against its manifest; a torn or
corrupt one is refused, naming the bad file and the newest intact checkpoint, which
`--resume RUN --checkpoint iter_N` picks. A full disk while saving leaves the previous checkpoints
as they were and stops the run with a clear error.

Nothing in it depends on the number of processes or the strategy: the adapters and the optimizer state
of the LoRA parameters are replicated on every rank, or, sharded (distributed.strategy=fsdp), gathered
whole before rank 0 writes them and cut back to each rank's shard when read, and the RNG states are
rank 0's (the one process that writes). Every random draw of an iteration derives from (run seed,
iteration) anyway, so a run saved on 8 GPUs resumes on 1, or on 4, and draws the same prompts, seeds
and noise.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import stat
import time
from pathlib import Path
from typing import Any, ContextManager

import numpy as np
import torch
from safetensors.torch import load_file

from solrl_core.engine.policy import LORA_FILE, OLD, TRAINED, Policy
from solrl_core.engine.sharding import Gathered, load_optimizer_state
from solrl_core.engine.state_schema import check_optimizer, check_rng, check_sizes, read_trainer_state
from solrl_core.errors import SolrlError
from solrl_core.faults import disk
from solrl_core.faults.links import FolderPin
from solrl_core.faults.manifest import verify, write_manifest
from solrl_core.faults.state_files import has_state, load_legacy, load_state, save_state
from solrl_core.io.rundir import CHECKPOINT_NAME, checkpoint_dir, list_checkpoints, pick_checkpoint

TMP_PREFIX = ".tmp-"  # a checkpoint being written: checkpoints/.tmp-iter_NNNNNN-<pid>-<ns>


class CheckpointFolder:
    """A run's `checkpoints/`, pinned (faults/links.py FolderPin) when the run opens it, or when its
    first save creates it: every save, rename and delete of the run goes through a handle checked
    against that folder, never through a path that may lead elsewhere by then."""

    def __init__(self, run_dir: Path) -> None:
        self.path = checkpoint_dir(run_dir)
        self.pin = FolderPin(self.path,
                             "the run's checkpoints") if self.path.exists() or self.path.is_symlink() else None

    def opened(self) -> ContextManager[int]:
        if self.pin is None:
            self.path.mkdir(parents=True, exist_ok=True)
            self.pin = FolderPin(self.path, "the run's checkpoints")
        return self.pin.opened()


def save_checkpoint(run_dir: Path, iteration: int, policy: Policy, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], keep: int, *, gathered: Gathered | None = None,
                    spare: set[str] = frozenset(),
                    folder_pin: CheckpointFolder | None = None) -> Path:
    """Write checkpoint `iteration` atomically and prune all but the newest `keep` and those named in
    `spare` (the run's last good and best ones: loop/hacking.py). `gathered`: the adapters and
    optimizer state of a sharded policy, gathered whole by every rank (sharding.py). `folder_pin`: the
    run's checkpoints folder as the run opened it (one pinned now without it): the files are written
    through its handle (/proc/self/fd where Linux has it), and the rename and the pruning are made
    relative to it, each after checking the folder is still that one."""
    pinned = folder_pin or CheckpointFolder(run_dir)
    folder = checkpoint_dir(run_dir)
    final = f"iter_{iteration:06d}"
    tmp = f"{TMP_PREFIX}{final}-{os.getpid()}-{time.monotonic_ns()}"
    made = False  # the temporary folder exists: a failure removes it
    try:
        with disk.writing(folder, f"checkpoint {final}", f"free space there (or lower run.keep_checkpoints), "
                                                          f"then `solrl train --resume {run_dir}`"):
            with pinned.opened() as fd:
                os.mkdir(tmp, dir_fd=fd)
                made = True
                _write(_through(fd, folder) / tmp, policy, optimizer, state, gathered)
            with pinned.opened() as fd:  # checked again: a folder swapped during the write gets no rename
                if final in os.listdir(fd):  # the same iteration saved again after a resume: swap, never half-replace
                    stale = f".old-{final}-{time.monotonic_ns()}"
                    os.rename(final, stale, src_dir_fd=fd, dst_dir_fd=fd)
                    os.rename(tmp, final, src_dir_fd=fd, dst_dir_fd=fd)
                    shutil.rmtree(stale, dir_fd=fd, ignore_errors=True)
                else:
                    os.rename(tmp, final, src_dir_fd=fd, dst_dir_fd=fd)
            disk.fsync_dir(folder)  # the rename itself survives a power loss
    except SolrlError as exc:
        _remove_tmp(pinned, tmp, made)
        previous = list_checkpoints(run_dir)
        kept = f"the previous checkpoint {previous[-1].name} is intact" if previous else "no earlier checkpoint exists"
        raise SolrlError(f"{exc.message}; {kept}", exc.fix) from exc.__cause__
    except BaseException:
        _remove_tmp(pinned, tmp, made)
        raise
    with pinned.opened() as fd:  # pruning deletes only in the run's own folder, through its handle
        names = sorted(n for n in os.listdir(fd) if CHECKPOINT_NAME.match(n)
                       and stat.S_ISDIR(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode))
        for old in names[:-keep]:
            if old not in spare:
                shutil.rmtree(old, dir_fd=fd, ignore_errors=True)
    return folder / final


def _through(fd: int, folder: Path) -> Path:
    """A path that reaches the folder open as `fd` whatever its name leads to now (Linux's /proc/self/fd),
    or its name where there is no /proc."""
    proc = Path(f"/proc/self/fd/{fd}")
    return proc if proc.is_dir() else folder


def _remove_tmp(pinned: CheckpointFolder, tmp: str, made: bool) -> None:
    """The half-written save removed from the run's own folder (never through a swapped path)."""
    if not made:
        return
    with contextlib.suppress(SolrlError, OSError), pinned.opened() as fd:
        shutil.rmtree(tmp, dir_fd=fd, ignore_errors=True)


def _write(tmp: Path, policy: Policy, optimizer: torch.optim.Optimizer, state: dict[str, Any],
           gathered: Gathered | None) -> None:
    """Every file of a checkpoint into `tmp`, synced, the manifest last."""
    adapters = gathered.adapters if gathered is not None else {}
    policy.save_lora(tmp, TRAINED, adapters.get(TRAINED))
    policy.save_lora(tmp / "old", OLD, adapters.get(OLD))
    policy.save_lora(tmp / "ema", "ema", adapters.get("ema"))
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    optimizer_state = gathered.optimizer if gathered is not None else optimizer.state_dict()
    save_state(optimizer_state, tmp, "optimizer")  # tensors and JSON, never a pickle (faults/state_files.py)
    save_state(rng, tmp, "rng")
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    _fsync_tree(tmp)
    write_manifest(tmp)  # last: a folder whose manifest is missing was never finished


def remove_orphans(run_dir: Path) -> list[str]:
    """Remove the temporary folders of saves a kill interrupted (`.tmp-iter_*`: never complete, never
    listed). Only the holder of the run's lock calls this, so no live save is touched. Returns a
    warning for each folder removed."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    notes = []
    for path in sorted(folder.glob(f"{TMP_PREFIX}iter_*")):
        shutil.rmtree(path, ignore_errors=True)
        notes.append(f"removed {path.name} from {folder}: a checkpoint save interrupted by a kill (never complete)")
    return notes


def checkpoint_to_resume(run_dir: Path, name: str | None = None) -> Path:
    """The checkpoint `--resume` continues from: `name` (iter_NNNNNN or a path) or the newest, checked
    against its manifest. A bad one is refused, naming the file at fault and the newest intact one."""
    found = list_checkpoints(run_dir)
    if not found:
        raise SolrlError(f"{run_dir} holds no complete checkpoint to resume from", "start it again without --resume")
    chosen = pick_checkpoint(run_dir, found, name)
    problem = verify(chosen)
    if problem is None:
        return chosen
    intact = next((p for p in reversed(found) if p != chosen and verify(p) is None), None)
    fix = (f"resume from the newest intact one: `solrl train --resume {run_dir} --checkpoint {intact.name}`" if intact
           else "no intact checkpoint is left: start the run again")
    raise SolrlError(f"checkpoint {chosen.name} is torn or corrupt ({problem}); newest intact: "
                     f"{intact.name if intact else 'none'}", fix)


def set_aside_newer(run_dir: Path, chosen: Path) -> list[Path]:
    """Rename the checkpoints newer than `chosen` to `superseded-iter_N` (kept, but no longer listed,
    resumed or pruned), so a run resumed from an older checkpoint does not mix its saves with them."""
    moved = []
    for path in list_checkpoints(run_dir):
        if path.name > chosen.name:
            target = path.with_name(f"superseded-{path.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            path.rename(target)
            moved.append(target)
    return moved


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())


def load_adapters(path: Path, policy: Policy) -> None:
    """The trained, old and EMA adapters of a checkpoint into `policy` (for resume, eval and infer)."""
    check_sizes(path, policy.trainable_parameters())  # a file no adapter could make is not read
    try:
        for adapter, sub in ((TRAINED, path), (OLD, path / "old"), ("ema", path / "ema")):
            tensors = load_file(str(sub / LORA_FILE))
            _check_rank(path, tensors, policy.lora_config.r)
            policy.load_state(adapter, {k.removeprefix("transformer."): v for k, v in tensors.items()})
    except SolrlError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read means the checkpoint cannot be trusted
        raise SolrlError(f"checkpoint {path} is unreadable or corrupt: {type(exc).__name__}: {exc}",
                         "resume from an earlier one with `--checkpoint iter_N`") from exc


def _check_rank(path: Path, tensors: dict[str, torch.Tensor], rank: int) -> None:
    """A LoRA rank changed in the run's config.toml after the checkpoint was saved is the config's
    fault, not the checkpoint's: say so, and which rank to restore."""
    saved = next((t.shape[0] for k, t in sorted(tensors.items()) if "lora_A" in k and t.ndim == 2), rank)
    if saved != rank:
        run = path.parent.parent
        raise SolrlError(f"{run / 'config.toml'}'s model.lora_rank ({rank}) does not match the adapter in checkpoint "
                         f"{path.name} (rank {saved})", f"restore lora_rank = {saved} under [model] in "
                                                        f"{run / 'config.toml'}")


def load_checkpoint(path: Path, policy: Policy, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore adapters, optimizer and RNG states; return the loop state. Corruption is a clear error."""
    load_adapters(path, policy)
    optimizer_state, rng = _read_state(path, "optimizer"), _read_state(path, "rng")
    state = read_trainer_state(path)  # every value against its schema (state_schema.py): before any is used
    check_optimizer(path, optimizer_state, optimizer)
    check_rng(path, rng)
    try:
        load_optimizer_state(optimizer, optimizer_state)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
    except Exception as exc:  # noqa: BLE001 - any failure to read means the checkpoint cannot be trusted
        raise SolrlError(f"checkpoint {path} is unreadable or corrupt: {type(exc).__name__}: {exc}",
                         "resume from an earlier one with `--checkpoint iter_N`") from exc
    if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state


def _read_state(path: Path, name: str) -> Any:
    """`name`'s state in the plain format, or in a checkpoint written before it, `name`.pt through
    the restricted unpickler (faults/state_files.py): never a pickle that can run code."""
    if has_state(path, name):
        return load_state(path, name)
    if (path / f"{name}.pt").is_file():
        return load_legacy(path / f"{name}.pt")
    raise SolrlError(f"checkpoint {path} has no {name} state ({name}.json)",
                     "resume from an earlier one with `--checkpoint iter_N`")
