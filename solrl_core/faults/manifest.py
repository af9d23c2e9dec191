"""A checkpoint's manifest: every file's size and SHA-256, written last.

The checkpoint folder is renamed into place only once complete, but a rename does not protect the
bytes: a disk that lost a block, a copy cut short, or a flipped bit leaves a folder that loads (a
safetensors file parses with a wrong value in it) and trains on garbage. The manifest lets `--resume`
tell an intact checkpoint from a torn or corrupt one before it loads anything.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from solrl_core.faults.links import find_link, kind

MANIFEST = "manifest.json"
FORMAT = 1


@dataclass(frozen=True)
class Problem:
    """Why a checkpoint cannot be trusted: the file at fault and what is wrong with it."""

    file: str  # relative to the checkpoint folder
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.reason}"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path) -> Path:
    """List every file under `folder` with its size and checksum; the manifest is written (and
    fsynced) after them, so a folder whose manifest is missing was never finished."""
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    path = folder / MANIFEST
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"format": FORMAT, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    return path


def verify(folder: Path) -> Problem | None:
    """The first problem of a checkpoint folder against its manifest, or None when every listed file
    is there with its size and checksum. Sizes are checked first: a truncated file is found without
    reading anything. A link out of the folder (or a special file) anywhere in it is a problem before
    any of that: nothing is read through it, listed or not (faults/links.py)."""
    link = find_link(folder)
    if link is not None:
        return Problem(link.relative_to(folder).as_posix(), f"{kind(link)}, which solrl does not follow out of a "
                                                            f"checkpoint")
    try:
        listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return Problem(MANIFEST, "missing (the checkpoint was never finished, or predates checksums)")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        return Problem(MANIFEST, f"unreadable ({type(exc).__name__})")
    malformed = _malformed(listed)
    if malformed:
        return Problem(MANIFEST, f"malformed ({malformed})")
    for name, entry in listed.items():
        path = folder / name
        if not path.is_file():
            return Problem(name, "missing")
        size = path.stat().st_size
        if size != entry["size"]:
            return Problem(name, f"truncated or overwritten: {size} bytes, {entry['size']} expected")
    for name, entry in listed.items():
        if sha256(folder / name) != entry["sha256"]:
            return Problem(name, "checksum mismatch (the file is corrupt)")
    return None


def _malformed(listed: object) -> str | None:
    """What is wrong with a manifest's "files" (a JSON object of relative path -> {size, sha256}),
    or None. A listed path may not leave the checkpoint folder."""
    if not isinstance(listed, dict):
        return f'"files" is a {type(listed).__name__}, not an object'
    for name, entry in listed.items():
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts or not parts:
            return f"{name!r} is not a path inside the checkpoint"
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and not isinstance(entry.get("size"), bool)
                and isinstance(entry.get("sha256"), str)):
            return f"{name!r} has no integer size and sha256 string"
    return None
