"""Nothing in a run folder is followed out of it.

A run folder can come from someone else, and a symbolic link in it points wherever its author chose:
a lock that is truncated, an events log that is appended to, a `checkpoints` folder whose old
iterations retention deletes, a state file read in place of the checkpoint's own. So a link whose
target lies outside the folder is refused, as is a special file (a fifo blocks its reader; solrl
writes none), in one line naming it, before anything in the folder is truncated, appended or deleted:

- `check_tree(root)` when a command opens a run folder (resume, eval, infer, export, explore,
  rank-check), before it reads or writes anything in it; `find_link(checkpoint)` in the manifest check;
- `check_path(root, *parts)` for one file a command reads (events.jsonl for compare and monitor);
- `open_nofollow` for the files a run opens to write (the lock, the events log, a file written
  atomically): any link there, even one planted after the check, is refused by the kernel (O_NOFOLLOW),
  and so is a hard link (a link count above 1, which O_NOFOLLOW does not see): it is one file with a
  name outside the folder, and writing it writes there;
- `FolderPin` for the folder a run saves into and prunes (`checkpoints/`, engine/checkpoint.py): its
  identity is taken once, and each save, rename and delete goes through a handle checked against it,
  so a folder swapped for a link or another folder mid-run is refused, never followed.

A link that stays inside the folder is left alone, and the folder itself may be a link: the user
named it on the command line. W&B's own folder (`wandb/`) is not looked into: solrl never reads it,
and W&B itself links its logs there to its cache outside the run folder. Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator

from solrl_core.errors import SolrlError

FIX = "replace the link with the real file or folder (or delete it), then run the command again"
NOT_READ = frozenset({"wandb"})  # folders at a run folder's top that solrl never reads (W&B's own)


def kind(path: Path) -> str:
    """What the link or special file at `path` is, for a message: 'a symbolic link (to TARGET)'."""
    try:
        return f"a symbolic link (to {os.readlink(path)})"
    except OSError:
        return "not a regular file or folder (a fifo, socket or device)"


def refused(path: Path, what: str = "the run folder") -> SolrlError:
    """The one line for a link or special file at `path` inside `what`."""
    return SolrlError(f"{path} is {kind(path)}: solrl does not follow it out of {what} (a run folder is data, "
                      "whoever wrote it)", FIX)


def _escapes(path: Path, mode: int, root: str) -> bool:
    """A special file, or a link whose target (all links resolved) is not under `root` (resolved)."""
    if stat.S_ISLNK(mode):
        target = os.path.realpath(path)
        return os.path.commonpath([target, root]) != root
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def find_link(root: str | Path) -> Path | None:
    """The first link out of `root` or special file anywhere under it (no link is followed), or None."""
    real = os.path.realpath(root)
    stack = [Path(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if folder == Path(root) and entry.name in NOT_READ:
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if _escapes(Path(entry.path), mode, real):
                return Path(entry.path)
            if stat.S_ISDIR(mode):
                stack.append(Path(entry.path))
    return None


def check_tree(root: str | Path, what: str = "the run folder") -> None:
    """Refuse the first link out of `root` or special file anywhere under it."""
    found = find_link(root)
    if found is not None:
        raise refused(found, what)


def check_path(root: str | Path, *parts: str, what: str = "the run folder") -> Path:
    """`root`/`parts`, after checking that no part of it below `root` is a link out of `root` or a
    special file (parts that do not exist yet are fine: nothing is followed there)."""
    real, path = os.path.realpath(root), Path(root)
    for part in parts:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break
        if _escapes(path, mode, real):
            raise refused(path, what)
    return path


def open_nofollow(path: Path, flags: int, mode: int = 0o644, what: str = "the run folder") -> int:
    """os.open(path, flags) that refuses any link at `path` (O_NOFOLLOW) and a special file (O_NONBLOCK
    keeps a fifo from blocking the open), in the one line of `refused`."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # ENXIO: a fifo opened to write with no reader
            raise refused(Path(path), what) from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refused(Path(path), what)
        if info.st_nlink > 1:  # another name for a file elsewhere: writing here would write there too
            raise SolrlError(f"{path} is a hard link ({info.st_nlink} names for one file): solrl does not write "
                             f"through it to a file outside {what} (a run folder is data, whoever wrote it)",
                             "replace it with a copy of its own (cp FILE FILE.new && mv FILE.new FILE), or delete it, "
                             "then run the command again")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class FolderPin:
    """A folder a run writes into and deletes from, its identity (device, inode) taken once; `opened()`
    gives a directory handle to it checked against that identity, for the writes, renames and deletes
    made through it (`dir_fd`), so a folder swapped since, for a link or for another folder renamed into
    its place, is refused in one line: nothing is written to or deleted from the other folder."""

    def __init__(self, path: Path, what: str = "the run folder") -> None:
        self.path, self.what = Path(path), what
        fd = self._open()
        try:
            info = os.fstat(fd)
            self.identity = (info.st_dev, info.st_ino)
        finally:
            os.close(fd)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link or a file where the folder was
                raise refused(self.path, self.what) from exc
            raise

    @contextlib.contextmanager
    def opened(self) -> Iterator[int]:
        """A handle to the folder, after checking it is still the one pinned."""
        fd = self._open()
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != self.identity:
                raise SolrlError(f"{self.path} is no longer the folder this run opened (another folder was put in its "
                                 f"place "
                                 "while the run went on): solrl writes and deletes nothing in it",
                                 "put the run's own folder back, then `solrl train --resume RUN`")
            yield fd
        finally:
            os.close(fd)
