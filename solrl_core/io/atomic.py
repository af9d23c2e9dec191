"""Small files written whole or not at all: a reader sees the old content or the new, never a torn
one. Apart from the run directory (rundir.py) so that a leaf such as rewards/identity.py can write
its record without importing the config."""

from __future__ import annotations

import os
from pathlib import Path

from solrl_core.faults import disk
from solrl_core.faults.links import open_nofollow


def write_atomic(path: Path, text: str) -> None:
    """Write a small file so that a reader sees the old or the new content, never a torn one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with disk.writing(path.parent, path.name):  # a full or read-only folder: one clear line
            tmp.unlink(missing_ok=True)  # a link planted under the temporary name goes, never written through
            with os.fdopen(open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)  # replaces a link at `path` itself, never its target
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
