"""Training prompts: a built-in set, a download set, a file, a saved dataset or a hub dataset
(`prompt_sets.py` reads the spec and the tables), and their split across ranks."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from solrl_core.data.prompt_sets import (
    DEFAULT_COLUMN,
    PromptSpec,
    download_sets,
    fetch_download,
    hub_offline,
    load_hub,
    load_saved,
    load_table,
    parse_spec,
)
from solrl_core.errors import SolrlError, close_matches

TABLES = (".parquet", ".csv")
FORMATS = "a .txt, .jsonl, .parquet or .csv file, a save_to_disk folder, or hf:OWNER/NAME[@SPLIT][:COLUMN]"


def builtin_sets() -> list[str]:
    folder = resources.files("solrl_presets") / "prompts"
    return sorted(e.name[:-4] for e in folder.iterdir() if e.name.endswith(".txt"))


def load_prompts(spec: str, origin: str = "--prompts") -> list[str]:
    """The prompts `spec` names (see `prompt_sets` for the syntax): a built-in or download set, a file,
    a `save_to_disk` folder or a hub dataset. `origin`: where the spec came from, for a missing file's fix."""
    parsed = parse_spec(spec)
    if parsed.hub:
        return load_hub(parsed)
    path = Path(parsed.source)
    if not path.exists():
        return _named(parsed, spec, origin)
    if path.is_dir():
        return load_saved(path, parsed)
    _no_split(parsed, path.name)
    if path.suffix in TABLES:
        return load_table(path, parsed)
    return _parse_file(path, parsed)


def _named(parsed: PromptSpec, spec: str, origin: str) -> list[str]:
    name = parsed.source
    downloads = download_sets()
    if name in builtin_sets():
        _no_split(parsed, f"built-in set {name}")
        _no_column(parsed, f"built-in set {name}")
        text = (resources.files("solrl_presets") / "prompts" / f"{name}.txt").read_text(encoding="utf-8")
        return _parse_lines(text, name)
    if name in downloads:
        _no_split(parsed, f"prompt set {name}")
        return _parse_file(fetch_download(downloads[name], hub_offline()), parsed)
    if missing_path(spec):
        raise SolrlError(f"prompt file {name} does not exist", f"check the path given to {origin}")
    raise SolrlError(f"unknown prompt set '{spec}'",
                     close_matches(name, builtin_sets() + sorted(downloads)) + f" or pass {FORMATS}")


def missing_path(spec: str) -> str:
    """The file or folder `spec` names when it reads as a path (a known suffix, or a folder separator)
    and does not exist; '' for a set name, a hub dataset or a path that exists."""
    parsed = parse_spec(spec)
    name = parsed.source
    if parsed.hub or Path(name).exists() or name in builtin_sets() or name in download_sets():
        return ""
    return name if Path(name).suffix in (".txt", ".jsonl", ".json", *TABLES) or "/" in name or os.sep in name else ""


def absolute_spec(spec: str) -> str:
    """`spec` with the local file or folder it names written as an absolute path (not resolving links),
    so a run's saved config reads the same from any working folder; a set name or hub dataset unchanged."""
    parsed = parse_spec(spec) if spec else None
    if parsed is None or parsed.hub or not Path(parsed.source).exists():
        return spec
    if parsed.source == spec:  # the whole spec is the path (parse_spec reads an existing path whole)
        return os.path.abspath(spec)
    return replace(parsed, source=os.path.abspath(parsed.source)).text


def _no_split(parsed: PromptSpec, what: str) -> None:
    if parsed.split:
        raise SolrlError(f"{what} has no splits, but --prompts names @{parsed.split}", f"drop @{parsed.split}")


def _no_column(parsed: PromptSpec, what: str) -> None:
    if parsed.column:
        raise SolrlError(f"{what} is one prompt a line, without columns, but --prompts names :{parsed.column}",
                         f"drop :{parsed.column}")


def _parse_file(path: Path, parsed: PromptSpec) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SolrlError(f"prompt file {path} is not UTF-8 text", "save it as UTF-8") from exc
    if path.suffix == ".jsonl":
        return _parse_jsonl(text, str(path), parsed.column or DEFAULT_COLUMN)
    _no_column(parsed, f"{path}")
    return _parse_lines(text, str(path))


def _parse_lines(text: str, source: str) -> list[str]:
    prompts = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts:
        raise SolrlError(f"prompt file {source} holds no prompts", "write one prompt per line")
    return prompts


def _parse_jsonl(text: str, source: str, key: str) -> list[str]:
    example = f'each line must be like {{"{key}": "a red fox"}}'
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SolrlError(f"{source} line {number} is not valid JSON: {exc.msg}", example) from exc
        prompt = row.get(key) if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            keys = f" (its keys: {', '.join(row)})" if isinstance(row, dict) and key not in row else ""
            fix = f"name the prompt key: --prompts {source}:KEY" if keys else example
            raise SolrlError(f"{source} line {number} has no \"{key}\" text{keys}", fix)
        prompts.append(prompt.strip())
    if not prompts:
        raise SolrlError(f"prompt file {source} holds no prompts",
                         f'write one JSON object per line: {{"{key}": "..."}}')
    return prompts


def text_keys(prompts: list[str]) -> list[int]:
    """One integer per prompt, equal for equal texts on every rank and run (a 62-bit BLAKE2 digest):
    the advantages' per-prompt statistics pool the samples of one text, whichever group drew them."""
    return [int.from_bytes(hashlib.blake2b(p.encode("utf-8"), digest_size=8).digest(), "little") >> 2 for p in prompts]


def prompts_for_iteration(prompts: list[str], count: int, rng: np.random.Generator) -> list[str]:
    """`count` prompt groups for one iteration, without repeats while the set allows."""
    order: list[int] = []
    while len(order) < count:
        order.extend(rng.permutation(len(prompts)).tolist())
    return [prompts[i] for i in order[:count]]


def check_split(count: int, world_size: int) -> None:
    """Each prompt group lives whole on one rank, so the groups must split evenly over the ranks."""
    if count % world_size == 0:
        return
    below, above = count // world_size * world_size, (count // world_size + 1) * world_size
    choices = f"{below} or {above}" if below else f"{above}"
    raise SolrlError(f"{count} prompt groups do not split evenly over {world_size} processes (each group runs whole on "
                     f"one)",
                     f"use --set run.prompts_per_iteration={choices} (a multiple of {world_size}), or another process "
                     f"count")


def shard(groups: list[str], rank: int, world_size: int) -> list[str]:
    """The prompt groups this rank owns: each group whole on one rank, contiguous slices in rank order."""
    check_split(len(groups), world_size)
    per = len(groups) // world_size
    return groups[rank * per:(rank + 1) * per]
