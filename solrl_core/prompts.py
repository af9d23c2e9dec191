"""Training prompts: a built-in set by name or a user file, and their split across ranks."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np

from solrl_core.errors import SolrlError, close_matches


def builtin_sets() -> list[str]:
    folder = resources.files("solrl_presets") / "prompts"
    return sorted(e.name[:-4] for e in folder.iterdir() if e.name.endswith(".txt"))


def load_prompts(spec: str) -> list[str]:
    """A built-in set name, a .txt file (one prompt per line, '#' comments) or a .jsonl file."""
    path = Path(spec)
    if spec in builtin_sets() and not path.exists():
        text = (resources.files("solrl_presets") / "prompts" / f"{spec}.txt").read_text(encoding="utf-8")
        return _parse_lines(text, spec)
    if not path.exists():
        if path.suffix in (".txt", ".jsonl", ".json") or "/" in spec:
            raise SolrlError(f"prompt file {spec} does not exist", "check the path given to --prompts")
        raise SolrlError(f"unknown prompt set '{spec}'", close_matches(spec, builtin_sets()) + " or pass a .txt / .jsonl file")
    if path.is_dir():
        raise SolrlError(f"--prompts {spec} is a folder", "pass a .txt file (one prompt per line) or a .jsonl file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SolrlError(f"prompt file {spec} is not UTF-8 text", "save it as UTF-8") from exc
    if path.suffix == ".jsonl":
        return _parse_jsonl(text, spec)
    return _parse_lines(text, spec)


def _parse_lines(text: str, source: str) -> list[str]:
    prompts = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts:
        raise SolrlError(f"prompt file {source} holds no prompts", "write one prompt per line")
    return prompts


def _parse_jsonl(text: str, source: str) -> list[str]:
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SolrlError(f"{source} line {number} is not valid JSON: {exc.msg}", 'each line must be like {"prompt": "a red fox"}') from exc
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise SolrlError(f"{source} line {number} has no \"prompt\" text", 'each line must be like {"prompt": "a red fox"}')
        prompts.append(prompt.strip())
    if not prompts:
        raise SolrlError(f"prompt file {source} holds no prompts", 'write one JSON object per line: {"prompt": "..."}')
    return prompts


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
    raise SolrlError(f"{count} prompt groups do not split evenly over {world_size} processes (each group runs whole on one)",
                     f"use --set run.prompts_per_iteration={choices} (a multiple of {world_size}), or another process count")


def shard(groups: list[str], rank: int, world_size: int) -> list[str]:
    """The prompt groups this rank owns: each group whole on one rank, contiguous slices in rank order."""
    check_split(len(groups), world_size)
    per = len(groups) // world_size
    return groups[rank * per:(rank + 1) * per]
