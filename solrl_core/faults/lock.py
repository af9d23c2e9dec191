"""One writer per run folder.

`RunLock.acquire` takes an exclusive `flock` on RUN_DIR/solrl.lock and writes who holds it (process
id, host, start time). The kernel drops a flock when its process ends, however it ends, so a lock
left by a killed run never blocks a resume: there is no stale state to clean up. The `filelock`
package does the same locking but truncates the file whenever another process tries it, which
would erase the holder's name; `fcntl` (the standard library) keeps it.

On a shared filesystem (several nodes) this relies on the filesystem's own locking (NFSv4 and
Lustre support flock); only rank 0 takes the lock. A filesystem without flock (ENOLCK, EOPNOTSUPP:
some NFS mounts) is refused with one line naming the opt-out, `run.lock = false`, which skips the
lock: then nothing stops two runs writing the same folder.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import socket
from pathlib import Path

from solrl_core.errors import SolrlError
from solrl_core.faults import disk
from solrl_core.faults.links import check_path, open_nofollow

LOCK_FILE = "solrl.lock"


class RunLock:
    """Held for the life of a run; `release` (or the process ending) gives it up."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, run_dir: Path, enabled: bool = True) -> "RunLock":
        """Lock `run_dir` (which must exist) or raise a SolrlError naming the process that holds it.
        `enabled` False (run.lock = false) takes no lock: an unheld RunLock."""
        path = Path(run_dir) / LOCK_FILE
        if not enabled:
            return cls(path, None)
        with disk.writing(run_dir, f"the run lock {LOCK_FILE}"):  # a read-only or full folder: one clear line
            fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)  # a planted link is refused, never truncated
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SolrlError(f"{run_dir} is being written by another solrl run ({holder(run_dir)})",
                             "wait for it to finish or stop it (Ctrl-C saves a checkpoint), or use another "
                             "--run-dir") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            raise SolrlError(f"the filesystem of {run_dir} does not support file locks (flock: "
                             f"{errno.errorcode[exc.errno]}), "
                             "which solrl takes so that two runs never write one folder",
                             "use a --run-dir on a local disk, or `--set run.lock=false` to run without the lock "
                             "(then nothing stops two runs writing the same folder)") from exc
        except BaseException:
            os.close(fd)
            raise
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": dt.datetime.now().isoformat(timespec="seconds")}
        try:
            with disk.writing(run_dir, f"the run lock {LOCK_FILE}"):
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(info).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # nobody holds it now: the next reader must not see this process named
        finally:
            os.close(fd)  # closing the last descriptor drops the flock

    def __del__(self) -> None:
        self.release()


def holder(run_dir: Path) -> str:
    """Who holds `run_dir`'s lock, as the holder wrote it ('unknown process' if unreadable)."""
    try:
        info = json.loads(check_path(run_dir, LOCK_FILE).read_text(encoding="utf-8"))
        return f"process {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError, SolrlError):
        return "unknown process"
