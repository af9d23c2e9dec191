"""The weights a run downloads: the base model's and the rewards' (local folder or Hugging Face
cache; gated repositories and HF_TOKEN; HF_HUB_OFFLINE), and the free disk for what is still to come."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from importlib import resources
from pathlib import Path

from solrl_core.config.schema import TINY_LOADERS, Config
from solrl_core.doctor.check import FAIL, PASS, WARN, Check, Machine
from solrl_core.plan.footprint import model_size
from solrl_core.rewards.endpoints import is_endpoint
from solrl_core.rewards.registry import RewardInfo, lookup

GATED_HINT = "accept its licence on huggingface.co/{repo} and set HF_TOKEN (or run `hf auth login`)"

def _cached(repo: str, names: tuple[str, ...], cache: Path) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo, n, cache_dir=cache), str) for n in names)


def _reward_weights(cfg: Config, m: Machine) -> tuple[list[Check], float]:
    """The trained rewards' weights, and the eval rewards' (run.eval_rewards, when the run evaluates):
    an eval reward's row says so, and its fix how to evaluate without it."""
    out, download = [], 0.0
    evals = [n for n in cfg.run.eval_rewards if n not in cfg.reward.weights] if cfg.run.eval_prompts else []
    for name in [*cfg.reward.weights, *evals]:
        if name in evals:
            checks, size = _reward_weights(replace(cfg, reward=replace(cfg.reward, weights={name: 1.0}),
                                                   run=replace(cfg.run, eval_prompts="")), m)
            rest = ",".join(n for n in cfg.run.eval_rewards if n != name)
            out += [replace(c, name=f"eval {c.name}", fix=f"{c.fix}; or evaluate without it: --set "
                                                          f"run.eval_rewards={rest}"
                            if c.fix else c.fix) for c in checks]
            download += size
            continue
        if is_endpoint(name):
            continue  # a remote: or vlm: reward loads its weights where it is served (doctor/remote.py asks it)
        info = lookup(name)
        if info is None:
            continue  # config validation has named it already
        if info.build is None:
            out.append(_plugin(name))
            continue
        check, size = _builtin_weights(info, cfg.reward.paths.get(name, ""), m)
        out.append(check)
        download += size
    return out, download


def _plugin(name: str) -> Check:
    """A plugin imports and can be called as (images, prompts), checked as a run checks it, without
    creating or calling it (a class may load a model when created)."""
    from solrl_core.errors import SolrlError
    from solrl_core.rewards.plugins import check_plugin

    row = f"reward plugin {name}"
    try:
        found = check_plugin(name)
    except SolrlError as exc:  # the row names the plugin: the detail says what is wrong with it
        return Check(row, FAIL, exc.message.removeprefix(f"reward plugin '{name}' "), exc.fix, True)
    return Check(row, PASS, f"imports and takes (images, prompts): {found}; its own weights are not checked", "", True)


def _builtin_weights(info: RewardInfo, local: str, m: Machine) -> tuple[Check, float]:
    name, row = info.name, f"reward weights {info.name}"
    if not info.hub_files:
        return Check(row, PASS, "needs no weights", "", True), 0.0
    needs = info.hub_files
    local_fix = f"--set reward.paths.{name}=DIR with {', '.join(info.local_files)}"
    if local:
        path = Path(local).expanduser()
        folder = path.parent if path.is_file() else path
        lacking = [f for f in info.local_files if not (folder / f).exists()]
        if not path.exists() or lacking:
            return Check(row, FAIL, f"reward.paths.{name} = {local} " + ("does not exist" if not path.exists() else
                         f"lacks {', '.join(lacking)}"), f"point it at a folder holding {', '.join(info.local_files)}",
                         True), 0.0
        still = {repo for repo, sub in info.hub_unless_local if not (folder / sub).is_dir()}
        if not still:
            return Check(row, PASS, f"local folder {folder}", "", True), 0.0
        needs = tuple(n for n in needs if n[0] in still)  # what the folder lacks still comes from the hub
    memory = f"; about {info.memory_gib:.1f} GiB on the device once loaded (approximate)"
    missing = [(repo, names) for repo, names in needs if not _cached(repo, names, m.cache)]
    if not missing:
        return Check(row, PASS, f"in the Hugging Face cache ({', '.join(dict.fromkeys(r for r, _ in needs))}){memory}",
                     "", True), 0.0
    what = ", ".join(f"{repo}/{'|'.join(names)}" for repo, names in missing)
    if m.offline:
        return Check(row, FAIL, f"not in the Hugging Face cache ({m.cache}) and HF_HUB_OFFLINE=1: missing {what}",
                     f"download hub {', '.join(dict.fromkeys(r for r, _ in missing))} once with network (unset "
                     f"HF_HUB_OFFLINE), or {local_fix}", True), 0.0
    return Check(row, WARN, f"not cached; will download on first use (~{info.download_gb:.1f} GB, approximate): "
                            f"{what}{memory}",
                 f"nothing to do with network access; offline: {local_fix}", True), info.download_gb


def _model_weights(cfg: Config, m: Machine) -> tuple[Check, float]:
    """The model-weights check, and how many GB (approximate) still have to be downloaded."""
    mc = cfg.model
    row = "model weights"
    if mc.loader in TINY_LOADERS:
        if not mc.weights:
            return Check(row, PASS, f"tiny model at random init (seed {mc.init_seed}): nothing to load", "", True), 0.0
        shipped = Path(str(resources.files("solrl_core.models"))) / mc.weights
        folder = Path(mc.weights) if Path(mc.weights).is_dir() else shipped
        missing = [f for f in ("config.json", "model.safetensors") if not (folder / f).is_file()]
        if missing:
            return Check(row, FAIL, f"tiny model weights '{mc.weights}' lack {', '.join(missing)} ({folder})",
                         "give a folder holding config.json and model.safetensors in model.weights, or leave it empty",
                         True), 0.0
        origin = "shipped with solrl" if folder == shipped else "local folder"
        return Check(row, PASS, f"tiny model '{mc.weights}' ({origin}: {folder})", "", True), 0.0
    from solrl_core.models.diffusers_models import missing_part
    from solrl_core.models.layouts import LAYOUTS

    layout = LAYOUTS.get(mc.loader)
    if layout is None:
        return Check(row, FAIL, f"unknown model loader '{mc.loader}'",
                     "model.loader must be one of: tiny, " + ", ".join(LAYOUTS), True), 0.0
    size = model_size(cfg)
    local_fix = f"pass a local {layout.name} diffusers folder with --model-path DIR"
    if mc.path:
        folder = Path(mc.path).expanduser()
        lacking = missing_part(folder, layout) if folder.is_dir() else "the folder itself"
        if lacking:
            return Check(row, FAIL, f"model.path {folder} lacks {lacking}",
                         f"use the hub's diffusers layout, e.g. `hf download {mc.hub_id or '<hub id>'} "
                         "--local-dir DIR`", True), 0.0
        return Check(row, PASS, f"local folder {folder} (model_index.json and every component)", "", True), 0.0
    if not mc.hub_id:
        return Check(row, FAIL, "model.hub_id and model.path are both empty", "set model.hub_id, or --model-path DIR",
                     True), 0.0
    from huggingface_hub import try_to_load_from_cache

    gated = f"; the repository is gated: {GATED_HINT.format(repo=mc.hub_id)}" if layout.gated else ""
    cached = try_to_load_from_cache(mc.hub_id, "model_index.json", cache_dir=m.cache)
    lacking = missing_part(Path(cached).parent, layout) if isinstance(cached, str) else None
    if isinstance(cached, str) and lacking is None:
        return Check(row, PASS, f"{mc.hub_id} is in the Hugging Face cache ({Path(cached).parent})", "", True), 0.0
    state = f"an incomplete snapshot is cached (lacks {lacking})" if isinstance(cached,
            str) else "not in the Hugging Face cache"
    if m.offline:
        return Check(row, FAIL, f"{mc.hub_id}: {state} ({m.cache}) and HF_HUB_OFFLINE=1",
                     f"download {mc.hub_id} once with network (unset HF_HUB_OFFLINE), or {local_fix}{gated}", True), 0.0
    return Check(row, WARN, f"{mc.hub_id}: {state}; will download on first use (~{size.download_gb:.0f} GB, "
                            f"approximate)",
                 f"nothing to do with network access; offline: {local_fix}{gated}", True), size.download_gb


def _has_token() -> bool:
    from huggingface_hub import constants

    if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return True
    return Path(constants.HF_TOKEN_PATH).is_file()  # `hf auth login` writes it; read without any network call


def _hub_token(cfg: Config, model_download: float) -> list[Check]:
    from solrl_core.models.layouts import LAYOUTS

    layout = LAYOUTS.get(cfg.model.loader)
    if layout is None or not layout.gated or cfg.model.path:
        return []
    if _has_token():
        return [Check("hub token", PASS, f"{cfg.model.hub_id} is gated; a Hugging Face token is set", "",
                      model_download > 0)]
    if model_download <= 0:
        return [Check("hub token", PASS, f"{cfg.model.hub_id} is gated, but its weights need no download here", "",
                      False)]
    return [Check("hub token", FAIL, f"{cfg.model.hub_id} is gated and no Hugging Face token is set (HF_TOKEN)",
                  GATED_HINT.format(repo=cfg.model.hub_id), True)]


def _hub_mode(m: Machine) -> Check:
    if m.offline:
        return Check("hub mode", PASS, f"HF_HUB_OFFLINE=1: only weights already in the cache ({m.cache}) are used", "",
                     False)
    return Check("hub mode", PASS, f"downloads allowed (HF_HUB_OFFLINE unset): missing weights download into {m.cache} "
                                   f"on first use", "", False)


HUB_PROBE_SECONDS = 3.0


def hub_reachable(m: Machine, download_gb: float, timeout: float = HUB_PROBE_SECONDS) -> Check | None:
    """Whether the hub (HF_ENDPOINT, default https://huggingface.co) answers, asked only when weights
    must still be downloaded and the hub is not switched off: one HEAD request (proxies honoured), any
    HTTP answer counts. None when there is nothing to ask."""
    import urllib.error
    import urllib.request

    if download_gb <= 0 or m.offline:
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        pass  # an answer, whatever its status: the hub is there
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Check("hub reachable", FAIL, f"cannot reach {endpoint} ({reason}) and ~{download_gb:.0f} GB of weights "
                     "must still be downloaded", "connect this machine, set HF_ENDPOINT to a mirror, or download the "
                     "weights elsewhere and pass --model-path / reward.paths.NAME (HF_HUB_OFFLINE=1 uses the cache "
                     "only)", True)
    return Check("hub reachable", PASS, f"{endpoint} answers; ~{download_gb:.0f} GB of weights to download", "", True)


def _disk(m: Machine, model_gb: float, reward_gb: float, cfg: Config) -> Check:
    need = model_gb + reward_gb
    probe = m.cache
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 1e9
    if need <= 0:
        return Check("disk space", PASS, f"{free:.0f} GB free at {probe}; nothing to download", "", False)
    detail = f"{free:.0f} GB free at {probe}; still to download ~{need:.0f} GB (approximate: {model_size(cfg).label})"
    fix = f"free space there, or point HF_HOME / HF_HUB_CACHE at a disk with more than {need * 1.1:.0f} GB free"
    if free < need:
        return Check("disk space", FAIL, detail, fix, True)
    if free < need * 1.1:
        return Check("disk space", WARN, detail + " (within 10%)", fix, True)
    return Check("disk space", PASS, detail, "", True)
