"""The run's prompt sets: a local file or folder is read (it is small), a hub dataset or a download set is
looked for in its cache and, when missing and the machine is online, asked for once with a short
timeout (`PROBE_SECONDS`): the hub's dataset page says whether it exists and whether it is gated."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from solrl_core.config.schema import Config
from solrl_core.doctor.check import FAIL, PASS, WARN, Check, Machine
from solrl_core.errors import SolrlError

PROBE_SECONDS = 3.0


def prompt_checks(cfg: Config, m: Machine, timeout: float = PROBE_SECONDS,
                  read: dict[str, list[str]] | None = None) -> list[Check]:
    """One check for run.prompts, and one for run.eval_prompts when it is set. `read`: prompts a run's
    own input checks already read, by spec (config/run_inputs.py): counted, not read again."""
    specs = {"prompts": cfg.run.prompts, "eval prompts": cfg.run.eval_prompts}
    return [Check(row, PASS, f"{spec}: {len(read[spec])} prompts", "", True) if spec in (read or {})
            else _check(row, spec, m, timeout) for row, spec in specs.items() if spec]


def _check(row: str, spec: str, m: Machine, timeout: float) -> Check:
    from solrl_core.data.prompt_sets import cached_path, download_fix, download_sets, parse_spec
    from solrl_core.data.prompts import load_prompts

    parsed = parse_spec(spec)
    if parsed.hub:
        return _hub_dataset(row, parsed.source, m, timeout)
    downloads = download_sets()
    if not Path(parsed.source).exists() and parsed.source in downloads:
        entry = downloads[parsed.source]
        path = cached_path(entry)
        if path.is_file():
            return Check(row, PASS, f"{spec}: downloaded ({path})", "", True)
        fix = download_fix(entry)
        if m.offline:
            return Check(row, FAIL, f"{spec}: not downloaded ({path}) and HF_HUB_OFFLINE=1", f"unset HF_HUB_OFFLINE "
                                                                                             f"once, {fix}", True)
        reason = _probe(urllib.request.Request(entry.url, method="HEAD"), timeout)[1]
        if reason:
            return Check(row, FAIL, f"{spec}: not downloaded and {entry.url} cannot be reached ({reason})",
                         f"connect this machine, {fix}", True)
        return Check(row, WARN, f"{spec}: not downloaded; fetched from {entry.origin} on first use", "nothing to do "
                                                                                                     "with network "
                                                                                                     "access", True)
    try:
        count = len(load_prompts(spec))
    except SolrlError as exc:
        return Check(row, FAIL, f"{spec}: {exc.message}", exc.fix, True)
    return Check(row, PASS, f"{spec}: {count} prompts", "", True)


def hub_dataset_cached(repo: str, m: Machine) -> Path | None:
    """The snapshot of `repo` in the hub cache, or the folder `datasets` prepared it in; None if neither."""
    snapshots = m.cache / f"datasets--{repo.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return snapshots
    try:
        import datasets.config as dc
    except ImportError:
        return None
    prepared = Path(dc.HF_DATASETS_CACHE) / repo.replace("/", "___")
    return prepared if prepared.is_dir() else None


def _hub_dataset(row: str, repo: str, m: Machine, timeout: float) -> Check:
    from solrl_core.doctor.weights import _has_token

    spec = f"hf:{repo}"
    fix = f"`hf download {repo} --repo-type dataset` with network (HF_TOKEN set if it is gated)"
    try:
        import datasets  # noqa: F401 - only whether it is installed
    except ImportError:
        return Check(row, FAIL, f"{spec}: hub datasets need the datasets library, which is not installed",
                     'pip install "solrl[data]"', True)
    folder = hub_dataset_cached(repo, m)
    if folder is not None:
        return Check(row, PASS, f"{spec}: in the Hugging Face cache ({folder})", "", True)
    if m.offline:
        return Check(row, FAIL, f"{spec}: not in the Hugging Face cache ({m.cache}) and HF_HUB_OFFLINE=1",
                     f"unset HF_HUB_OFFLINE once, or {fix}", True)
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    info, reason = _probe(urllib.request.Request(f"{endpoint}/api/datasets/{repo}"), timeout)
    if reason:
        return Check(row, FAIL, f"{spec}: not cached and the hub cannot tell about it ({reason})", fix, True)
    if info.get("gated") and not _has_token():
        return Check(row, FAIL, f"{spec}: gated and no Hugging Face token is set (HF_TOKEN)",
                     f"accept its terms on huggingface.co/datasets/{repo} and set HF_TOKEN (or run `hf auth login`)",
                     True)
    return Check(row, WARN, f"{spec}: not cached; the hub has it, downloaded on first use", "nothing to do with "
                                                                                            "network access", True)


def _probe(request: urllib.request.Request, timeout: float) -> tuple[dict, str]:
    """(the JSON answer or {}, '' or why the request failed): any answer but 404/401 counts as there."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read() if request.get_method() == "GET" else b""
    except urllib.error.HTTPError as exc:
        return {}, {401: "private, or no such dataset", 404: "no such file or dataset"}.get(exc.code, "")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {}, str(getattr(exc, "reason", exc))
    try:
        info = json.loads(body) if body else {}
    except json.JSONDecodeError:
        info = {}
    return info if isinstance(info, dict) else {}, ""
