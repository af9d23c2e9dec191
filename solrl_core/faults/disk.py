"""Full and read-only filesystems, recognised whatever raised them, and said in one line.

A full disk reaches us in several shapes: an OSError with errno ENOSPC or EDQUOT (plain writes), a
RuntimeError from torch.save whose context is that OSError (when it writes to a file object; given a
path it says only "unexpected pos"), or a SafetensorError whose message ends "No space left on
device (os error 28)" (safetensors, and so diffusers' save_pretrained). `disk_full` looks through
the exception, its message and its causes for any of them; `writing(folder, what)` turns them (and
a read-only or unwritable folder: EROFS, EACCES) into a SolrlError naming the folder, the free
space on its filesystem and the fix. Torch-free: the CLI uses it for errors it did not expect.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from solrl_core.errors import SolrlError

_FULL = {errno.ENOSPC, errno.EDQUOT}
_FULL_TEXT = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
_READ_ONLY = {errno.EROFS: "on a read-only filesystem", errno.EACCES: "not writable (permission denied)"}
_READ_ONLY_TEXT = {"read-only file system": errno.EROFS, "os error 30": errno.EROFS,
                   "permission denied": errno.EACCES, "os error 13": errno.EACCES}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) says the filesystem is full or over its quota."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _FULL:
            return True
        if any(text in str(e).lower() for text in _FULL_TEXT):
            return True
    return False


def read_only(exc: BaseException) -> int | None:
    """EROFS or EACCES when `exc` (or what caused it) says a folder cannot be written; else None."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _READ_ONLY:
            return e.errno
        found = next((code for text, code in _READ_ONLY_TEXT.items() if text in str(e).lower()), None)
        if found is not None:
            return found
    return None


def free_space(path: str | Path) -> str:
    """The free space on `path`'s filesystem (its nearest existing folder), e.g. '1.5 MiB'."""
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        free = float(shutil.disk_usage(here).free)
    except OSError:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if free < 1024 or unit == "GiB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "unknown"


def explain(exc: BaseException, folder: str | Path | None, what: str, fix: str = "") -> SolrlError | None:
    """The one-line SolrlError for a full or read-only filesystem, or None when `exc` is neither.
    `folder` None: the folder of the OSError's file name, where there is one."""
    if folder is None:
        name = next((e.filename for e in _chain(exc) if isinstance(e, OSError) and e.filename), None)
        folder = Path(os.fsdecode(name)).parent if name else None
    where = f" to {folder}" if folder is not None else ""
    if disk_full(exc):
        free = f" ({free_space(folder)} free on that filesystem)" if folder is not None else ""
        return SolrlError(f"the disk is full: {what} could not be written{where}{free}",
                          fix or "free space on that filesystem (or write somewhere else), then run the command again")
    code = read_only(exc)
    if code is not None:
        return SolrlError(f"{folder or 'the folder'} is {_READ_ONLY[code]}: {what} could not be written",
                          fix or "pass --run-dir (or --out) a folder you can write to")
    return None


@contextlib.contextmanager
def writing(folder: str | Path, what: str, full_fix: str = "") -> Iterator[None]:
    """Around a write into `folder`: a full or read-only filesystem becomes one clear SolrlError
    (`full_fix` is its fix on a full disk); any other error passes through unchanged."""
    try:
        yield
    except SolrlError:
        raise
    except Exception as exc:
        error = explain(exc, folder, what, full_fix if disk_full(exc) else "")
        if error is None:
            raise
        raise error from exc


def fsync_dir(folder: Path) -> None:
    """Make a rename (or a file created) in `folder` survive a power loss: fsync the folder itself."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
