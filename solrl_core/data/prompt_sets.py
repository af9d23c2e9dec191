"""Prompt sets beyond the shipped text files: what `--prompts` means, tables and datasets, downloads.

A spec is one string, read in this order:
- `hf:OWNER/NAME[@SPLIT][:COLUMN]`: a Hugging Face dataset by id (split `train` and column `prompt`
  unless named), through `datasets.load_dataset`; offline (HF_HUB_OFFLINE=1, or the hub unreachable)
  from the hub cache alone.
- a path that exists, whole: a file or folder (below), with the default split and column;
- `PATH[@SPLIT][:COLUMN]`: a `.txt` file (one prompt a line, no column), a `.jsonl`, `.parquet` or
  `.csv` file (column `prompt` unless named), or a folder written by `Dataset.save_to_disk` (a
  `DatasetDict` folder takes `@SPLIT`, `train` unless named);
- a built-in set shipped with solrl (`solrl presets`), or a set declared in
  `presets/prompts/downloads.toml`: the official runs' prompt files, downloaded on first use.

Libraries: `datasets` (the `data` extra) for hub ids and `save_to_disk` folders; pyarrow, which
`datasets` installs, for `.parquet` and `.csv` files. Both are imported only when such a set is asked for.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import tomllib

from solrl_core.errors import SolrlError

DEFAULT_COLUMN = "prompt"
DEFAULT_SPLIT = "train"
DOWNLOAD_SECONDS = 30.0
INSTALL_HINT = 'install the data extra: pip install "solrl[data]" (or pip install "datasets>=3")'

_HUB = re.compile(r"(?P<source>[\w.-]+/[\w.-]+)(?:@(?P<split>[\w.-]+))?(?::(?P<column>[^:@/]+))?")
_LOCAL = re.compile(r"(?P<source>.+?)(?:@(?P<split>[\w.-]+))?(?::(?P<column>[^:@/\\]+))?")


@dataclass(frozen=True)
class PromptSpec:
    source: str  # a path, a hub dataset id or a set name
    hub: bool = False
    split: str = ""  # '' = the default
    column: str = ""  # '' = the default

    @property
    def text(self) -> str:
        """The spec as written back (hf: prefix, @split, :column)."""
        return ("hf:" if self.hub else "") + self.source + (f"@{self.split}" if self.split else "") + (
            f":{self.column}" if self.column else "")


def parse_spec(spec: str) -> PromptSpec:
    if spec.startswith("hf:"):
        m = _HUB.fullmatch(spec[3:])
        if m is None:
            raise SolrlError(f"--prompts {spec} is not a Hugging Face dataset spec",
                             "write hf:OWNER/NAME, hf:OWNER/NAME@SPLIT or hf:OWNER/NAME@SPLIT:COLUMN")
        return PromptSpec(m["source"], True, m["split"] or "", m["column"] or "")
    if Path(spec).exists():
        return PromptSpec(spec)
    m = _LOCAL.fullmatch(spec)
    if m is None or not (m["split"] or m["column"]):
        return PromptSpec(spec)
    return PromptSpec(m["source"], False, m["split"] or "", m["column"] or "")


# -- sets declared once, downloaded on first use ------------------------------------------------------

@dataclass(frozen=True)
class DownloadSet:
    name: str
    url: str
    blob: str  # git blob id of the file: what the download is checked against
    description: str
    origin: str  # repository and path, as `solrl presets` shows it

    @property
    def suffix(self) -> str:
        return Path(self.url).suffix


def download_sets() -> dict[str, DownloadSet]:
    """Every set of presets/prompts/downloads.toml, by name."""
    table = tomllib.loads((resources.files("solrl_presets") / "prompts" / "downloads.toml").read_text(encoding="utf-8"))
    base = f"https://raw.githubusercontent.com/{table['repo']}/{table['commit']}"
    return {name: DownloadSet(name, f"{base}/{row['path']}", row["blob"], row["description"], f"{table['repo']} "
                                                                                              f"{row['path']}")
            for name, row in table["sets"].items()}


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "solrl" / "prompts"


def cached_path(entry: DownloadSet) -> Path:
    return cache_folder() / f"{entry.name}{entry.suffix}"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fetch_download(entry: DownloadSet, offline: bool) -> Path:
    """The cached file of `entry`, downloaded first when it is not there (never when `offline`), with the
    progress bar a model download shows (huggingface_hub's; HF_HUB_DISABLE_PROGRESS_BARS=1 hides both)."""
    path = cached_path(entry)
    if path.is_file():
        return path
    fix = download_fix(entry)
    if offline:
        raise SolrlError(f"prompt set {entry.name} is not downloaded ({path}) and HF_HUB_OFFLINE=1",
                         f"run once with network (unset HF_HUB_OFFLINE), {fix}")
    try:
        with urllib.request.urlopen(entry.url, timeout=DOWNLOAD_SECONDS) as answer:
            data = _read_with_progress(answer, entry)
    except (urllib.error.URLError, OSError) as exc:
        raise SolrlError(f"cannot download prompt set {entry.name} from {entry.url} ({getattr(exc, 'reason', exc)})",
                         f"connect this machine, {fix}") from exc
    if git_blob_id(data) != entry.blob:
        raise SolrlError(f"the download of prompt set {entry.name} is not the expected file (git blob {entry.blob})",
                         f"retry later, {fix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)
    return path


def download_fix(entry: DownloadSet) -> str:
    """How to do without the network: the file by hand, or another set for a quick look."""
    return (f"or download {entry.url} to {cached_path(entry)} yourself, or pass a local file "
            f"(--prompts FILE.txt), or for a quick look the built-in set: --prompts general "
            f"(--set run.eval_prompts=general for evaluation)")


def progress_bar(total: int | None, desc: str) -> Any:
    """The bar model downloads show (huggingface_hub's tqdm; HF_HUB_DISABLE_PROGRESS_BARS=1 hides it)."""
    from huggingface_hub.utils import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=desc)


def _read_with_progress(answer: Any, entry: DownloadSet, chunk: int = 1 << 16) -> bytes:
    length = answer.headers.get("Content-Length") if answer.headers is not None else None
    parts: list[bytes] = []
    with progress_bar(int(length) if length else None, f"prompt set {entry.name}") as bar:
        while block := answer.read(chunk):
            parts.append(block)
            bar.update(len(block))
    return b"".join(parts)


# -- tables: a column of text ---------------------------------------------------------------------------

def column_texts(values: list[Any], columns: list[str], spec: PromptSpec, where: str) -> list[str]:
    """The prompts of one column's values (empty and missing values skipped); `where` names the set."""
    column = spec.column or DEFAULT_COLUMN
    if column not in columns:
        raise SolrlError(f"{where} has no column '{column}' (its columns: {', '.join(columns) or 'none'})",
                         f"name the prompt column: --prompts "
                         f"{PromptSpec(spec.source, spec.hub, spec.split, 'COLUMN').text}")
    prompts = []
    for value in values:
        if value is None:
            continue
        if not isinstance(value, str):
            raise SolrlError(f"column '{column}' of {where} holds {type(value).__name__} values, not text",
                             "name a column of text: SPEC:COLUMN")
        if value.strip():
            prompts.append(value.strip())
    if not prompts:
        raise SolrlError(f"column '{column}' of {where} holds no prompts", "name a column with text in it: SPEC:COLUMN")
    return prompts


def load_table(path: Path, spec: PromptSpec) -> list[str]:
    """A .parquet or .csv file's prompt column, read with pyarrow."""
    try:
        import pyarrow.csv as pa_csv
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise SolrlError(f"reading {path.name} needs pyarrow, which is not installed", INSTALL_HINT) from exc
    try:
        if path.suffix == ".parquet":
            columns = pq.read_schema(path).names
            table = pq.read_table(path, columns=[c for c in columns if c == (spec.column or DEFAULT_COLUMN)])
        else:
            table = pa_csv.read_csv(path)
            columns = table.column_names
    except Exception as exc:  # pyarrow raises ArrowInvalid and OSError subclasses for unreadable files
        raise SolrlError(f"cannot read {path}: {str(exc).splitlines()[0]}", f"check that it is a valid "
                                                                            f"{path.suffix[1:]} file") from exc
    column = spec.column or DEFAULT_COLUMN
    values = table.column(column).to_pylist() if column in table.column_names else []
    return column_texts(values, columns, spec, str(path))


# -- Hugging Face datasets ------------------------------------------------------------------------------

def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise SolrlError("Hugging Face dataset prompt sets need the datasets library, which is not installed",
                         INSTALL_HINT) from exc
    datasets.disable_progress_bars()
    return datasets


def _pick_split(found: list[str], spec: PromptSpec, where: str) -> str:
    split = spec.split or (DEFAULT_SPLIT if DEFAULT_SPLIT in found or len(found) != 1 else found[0])
    if split not in found:
        raise SolrlError(f"{where} has no split '{split}' (its splits: {', '.join(found)})",
                         f"name one: --prompts {PromptSpec(spec.source, spec.hub, found[0], spec.column).text}")
    return split


def load_saved(path: Path, spec: PromptSpec) -> list[str]:
    """A folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`."""
    if not any((path / marker).is_file() for marker in ("state.json", "dataset_dict.json")):
        raise SolrlError(f"--prompts {path} is a folder but not a saved dataset (no state.json or dataset_dict.json)",
                         "pass a folder written by Dataset.save_to_disk, or a .txt / .jsonl / .parquet / .csv file")
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise SolrlError(f"--prompts {path} is a folder but not a saved dataset ({str(exc).splitlines()[0]})",
                         "pass a folder written by Dataset.save_to_disk, or a .txt / .jsonl / .parquet / .csv "
                         "file") from exc
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded[_pick_split(list(loaded), spec, str(path))]
    elif spec.split:
        raise SolrlError(f"{path} holds one dataset, without splits", f"drop @{spec.split}")
    column = spec.column or DEFAULT_COLUMN
    return column_texts(loaded[column] if column in loaded.column_names else [], loaded.column_names, spec, str(path))


def hub_offline() -> bool:
    """HF_HUB_OFFLINE or HF_DATASETS_OFFLINE: nothing is downloaded, only caches are read."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_DATASETS_OFFLINE", "").upper() in ("1", "ON", "YES",
                                                                                                   "TRUE")


def load_hub(spec: PromptSpec) -> list[str]:
    """A hub dataset's split and column. Online through `load_dataset`; offline, or when the hub cannot
    be reached, from the snapshot in the hub cache (what `load_dataset` or `hf download` left there)."""
    datasets = _datasets()
    where = f"hub dataset {spec.source}"
    split = spec.split or DEFAULT_SPLIT
    loaded = None
    if not hub_offline():
        try:
            loaded = datasets.load_dataset(spec.source, split=split)
        except ConnectionError:
            loaded = None  # unreachable: try the cache below
        except ValueError as exc:
            raise _load_error(exc, spec, where) from exc
        except Exception as exc:  # DatasetNotFoundError, gated repositories, HTTP errors
            raise SolrlError(f"cannot load {where}: {str(exc).splitlines()[0]}", _hub_fix(spec.source)) from exc
    if loaded is None:
        loaded = _from_hub_cache(datasets, spec, split, where)
    column = spec.column or DEFAULT_COLUMN
    return column_texts(loaded[column] if column in loaded.column_names else [], loaded.column_names, spec, where)


def _from_hub_cache(datasets: Any, spec: PromptSpec, split: str, where: str) -> Any:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(spec.source, repo_type="dataset", local_files_only=True)
    except LocalEntryNotFoundError as exc:
        raise SolrlError(f"{where} is not in the Hugging Face cache and the hub is offline or unreachable",
                         _hub_fix(spec.source)) from exc
    try:
        return datasets.load_dataset(folder, split=split)
    except ValueError as exc:
        raise _load_error(exc, spec, where) from exc


def _load_error(exc: ValueError, spec: PromptSpec, where: str) -> SolrlError:
    message = str(exc).splitlines()[0]
    if "split" in message.lower():  # datasets: 'Unknown split "x". Should be one of [...]'
        return SolrlError(f"{where} has no split '{spec.split or DEFAULT_SPLIT}' ({message})",
                          f"name one of its splits: --prompts hf:{spec.source}@SPLIT")
    return SolrlError(f"cannot load {where}: {message}", _hub_fix(spec.source))


def _hub_fix(repo: str) -> str:
    return (f"check the id at huggingface.co/datasets/{repo}; download it once with network (`hf download {repo} "
            "--repo-type dataset`); a gated dataset needs its terms accepted and HF_TOKEN set")
