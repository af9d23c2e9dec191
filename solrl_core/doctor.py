"""`solrl doctor`: can this machine run the requested run, and if not, what to do about it.

`run_checks(cfg)` returns one `Check` per fact: the software stack (Python, torch and its CUDA
build, Transformer Engine, diffusers/transformers/peft and the combinations known to
break), the GPUs and the explore precisions each supports, the reward backends and weights, the
base model's weights (local folder or Hugging Face cache; gated repositories and HF_TOKEN; the
HF_HUB_OFFLINE state), free disk for what is still to download, processes versus GPUs, a peak GPU
memory ESTIMATE, and whether the explore precision runs here. Each check says whether the
requested run depends on it (`needed_by_run`); the CLI exits non-zero only for those that fail.

Nothing here touches the network: the hub is only asked through its local cache
(`huggingface_hub.try_to_load_from_cache`). Sizes below are approximate, from the models' published
parameter counts and repository sizes, and are labelled so wherever they are shown.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from solrl_core.precision import hardware
from solrl_core.config import EXPLORE_PRECISIONS, Config
from solrl_core.footprint import REWARD_DOWNLOAD_GB, estimate_memory, model_size
from solrl_core.precision.hardware import GpuInfo

PASS, WARN, FAIL = "pass", "warn", "fail"
MIN_PYTHON = (3, 10)
EXPLORE_FAMILIES = ("sol_rl", "naive_quant")  # the families whose Stage 1 runs at the explore precision
GATED_HINT = "accept its licence on huggingface.co/{repo} and set HF_TOKEN (or run `hf auth login`)"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""
    needed_by_run: bool = False

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)



# The weights each model reward loads from the hub: (repo, alternatives: any one cached will do).
# They mirror the backend modules' constants (a test keeps them in step).
REWARD_FILES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "imagereward": (("THUDM/ImageReward", ("ImageReward.pt",)), ("THUDM/ImageReward", ("med_config.json",)),
                    ("bert-base-uncased", ("vocab.txt",))),
    "pickscore": (("yuvalkirstain/PickScore_v1", ("config.json",)),
                  ("yuvalkirstain/PickScore_v1", ("model.safetensors", "pytorch_model.bin")),
                  ("laion/CLIP-ViT-H-14-laion2B-s32B-b79K", ("preprocessor_config.json",)),
                  ("laion/CLIP-ViT-H-14-laion2B-s32B-b79K", ("tokenizer.json", "vocab.json"))),
    "clipscore": (("openai/clip-vit-large-patch14", ("config.json",)),
                  ("openai/clip-vit-large-patch14", ("model.safetensors", "pytorch_model.bin")),
                  ("openai/clip-vit-large-patch14", ("preprocessor_config.json",)),
                  ("openai/clip-vit-large-patch14", ("tokenizer.json", "vocab.json"))),
    "hpsv2": (("xswu/HPSv2", ("HPS_v2.1_compressed.pt",)),),
}
# What a local folder given as reward.paths.NAME must hold (imagereward's tokenizer/ is optional).
REWARD_LOCAL_FILES = {"imagereward": ("ImageReward.pt", "med_config.json"), "pickscore": ("config.json",),
                      "clipscore": ("config.json",), "hpsv2": ("HPS_v2.1_compressed.pt",)}



# --- the facts shared by the checks ----------------------------------------------------------------

@dataclass(frozen=True)
class _Machine:
    gpus: list[GpuInfo]
    te: hardware.TEStatus
    offline: bool
    cache: Path


def _machine() -> _Machine:
    from huggingface_hub import constants

    return _Machine(hardware.gpus(), hardware.transformer_engine_status(),
                    bool(constants.HF_HUB_OFFLINE), Path(constants.HF_HUB_CACHE))


def run_checks(cfg: Config | None, nproc: int = 1, explore_precision: str | None = None) -> list[Check]:
    """Every check for running `cfg` with `nproc` processes (cfg None: the machine alone).
    `explore_precision` overrides cfg.explore.precision and may also be 'nvfp4' or 'fp8'."""
    m = _machine()
    rewards = set(cfg.reward.weights) if cfg is not None else set()
    requested = explore_precision or (cfg.explore.precision if cfg is not None else None)
    checks = [_python(), _torch(m)]
    gpu: GpuInfo | None = None
    if cfg is not None:
        device_check, gpu = _device(cfg, m)
        checks.append(device_check)
    elif m.gpus:
        gpu = m.gpus[0]
    checks += _gpus(m, gpu)
    # Transformer Engine matters to the run only when its Stage 1 runs at the explore precision.
    low = requested if cfg is not None and cfg.algorithm.family in EXPLORE_FAMILIES else None
    checks.append(_transformer_engine(m, gpu, low))
    checks += [_library(name) for name in ("diffusers", "transformers", "peft")]
    checks += _combinations(rewards)
    checks.append(_torchvision(rewards))
    checks += _reward_backends(rewards)
    checks.append(_hub_mode(m))
    if cfg is None:
        return checks
    model_check, model_download = _model_weights(cfg, m)
    checks.append(model_check)
    checks += _hub_token(cfg, model_download)
    reward_checks, reward_download = _reward_weights(cfg, m)
    checks += reward_checks
    checks.append(_disk(m, model_download, reward_download, cfg))
    checks.append(_processes(nproc, m, gpu))
    checks.append(_memory(cfg, gpu, requested) if gpu is not None else _memory_without_gpu(cfg, requested))
    checks.append(_explore(cfg, gpu, requested))
    return checks


def failed_for_run(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == FAIL and c.needed_by_run]


# --- software --------------------------------------------------------------------------------------

def _python() -> Check:
    v = sys.version_info
    ok = v[:2] >= MIN_PYTHON
    return Check("python", PASS if ok else FAIL, f"Python {v.major}.{v.minor}.{v.micro} ({sys.executable})",
                 "" if ok else f"solrl needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}", True)


def _torch(m: _Machine) -> Check:
    import torch

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    avail = f"CUDA available: yes, {len(m.gpus)} GPU(s)" if m.gpus else "CUDA available: no"
    return Check("torch", PASS, f"torch {torch.__version__}, {build}; {avail}", "", True)


def _device(cfg: Config, m: _Machine) -> tuple[Check, GpuInfo | None]:
    import torch

    name = cfg.run.device
    real = cfg.model.loader != "tiny"
    if name == "auto":
        name = "cuda:0" if m.gpus else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        return Check("run device", FAIL, f"run.device '{cfg.run.device}' is not a device", "use auto, cpu, cuda or cuda:N",
                     True), None
    if device.type == "cuda":
        index = device.index or 0
        if not m.gpus:
            return Check("run device", FAIL, f"run.device {cfg.run.device} asks for CUDA, but torch sees no GPU",
                         "use --device cpu, or run on a machine with an NVIDIA GPU and a CUDA build of torch", True), None
        if index >= len(m.gpus):
            return Check("run device", FAIL, f"run.device {cfg.run.device}: this machine has {len(m.gpus)} GPU(s)",
                         f"choose one of cuda:0..cuda:{len(m.gpus) - 1}", True), None
        gpu = m.gpus[index]
        return Check("run device", PASS, f"run.device {cfg.run.device} -> cuda:{index} ({gpu.name})", "", True), gpu
    if device.type != "cpu":
        return Check("run device", FAIL, f"run.device {cfg.run.device}: solrl runs on cpu or cuda", "use auto, cpu, cuda or cuda:N",
                     True), None
    if real:
        return Check("run device", WARN, f"run.device {cfg.run.device} -> cpu: the {cfg.model.loader} model on a CPU is "
                     "impractically slow (hours per iteration)", "run it on a machine with an NVIDIA GPU", True), None
    return Check("run device", PASS, f"run.device {cfg.run.device} -> cpu", "", True), None


def _gpus(m: _Machine, run_gpu: GpuInfo | None) -> list[Check]:
    if not m.gpus:
        return [Check("gpus", PASS, "none visible to torch: runs use the CPU", "", False)]
    out = []
    for gpu in m.gpus:
        ok = hardware.supported(hardware.explore_precisions(gpu))
        out.append(Check(f"gpu cuda:{gpu.index}", PASS, f"{gpu.name}, compute capability {gpu.capability[0]}.{gpu.capability[1]}, "
                         f"{gpu.memory_gib:.0f} GiB; explore precisions here: {', '.join(ok)}", "", gpu == run_gpu))
    return out


def _transformer_engine(m: _Machine, gpu: GpuInfo | None, requested: str | None) -> Check:
    needed = requested == "nvfp4"
    if m.te.installed:
        parts = [f"Transformer Engine {m.te.version or '(version unknown)'}"]
        if gpu is not None:
            for kind in ("nvfp4", "fp8"):
                answer = hardware.te_support(kind, gpu)
                parts.append(f"{kind.upper()} on cuda:{gpu.index}: " + ("no check function found" if answer is None else
                             "yes" if answer[0] else f"no ({answer[1]})"))
        else:
            parts.append("no GPU to ask about NVFP4/FP8")
        return Check("transformer engine", PASS, "; ".join(parts), "", needed)
    capable = gpu is not None and gpu.capability >= hardware.NVFP4_CC
    status = FAIL if needed else WARN if capable else PASS
    detail = m.te.reason + ("" if needed or capable else " (optional: only a real NVFP4 explore copy would use it)")
    fix = hardware.TE_INSTALL if status != PASS else ""
    return Check("transformer engine", status, detail, fix, needed)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _library(name: str) -> Check:
    version = _dist_version(name)
    if version is None:
        return Check(name, FAIL, "not installed (a core dependency of solrl)", f"pip install {name}  (or reinstall solrl)", True)
    return Check(name, PASS, f"{name} {version}", "", True)


def _major(version: str | None) -> int:
    try:
        return int((version or "0").split(".")[0])
    except ValueError:
        return 0


def _combinations(rewards: set[str]) -> list[Check]:
    out = []
    ir, tf = _dist_version("image-reward"), _dist_version("transformers")
    if ir is not None:
        if _major(tf) >= 5:
            detail = (f"image-reward {ir} does not import as published under transformers {tf}: handled by solrl's compat "
                      "layer (solrl_core/rewards/compat.py), in memory, no site-packages edit")
        else:
            detail = f"image-reward {ir} with transformers {tf}: works as published"
        out.append(Check("image-reward + transformers", PASS, detail, "", "imagereward" in rewards))
    st = _dist_version("setuptools")
    if st is not None and importlib.util.find_spec("pkg_resources") is None:
        out.append(Check("setuptools", PASS, f"setuptools {st} has no pkg_resources: fine, nothing solrl loads needs it "
                         "(no downgrade needed)", "", False))
    return out


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release built for a torch 2.x release: 0.(minor + 15).patch."""
    parts = torch_version.split("+")[0].split(".")
    try:
        major, minor, patch = int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0
    except (ValueError, IndexError):
        return None
    return f"0.{minor + 15}.{patch}" if major == 2 else None


def _torchvision(rewards: set[str]) -> Check:
    import torch

    needed = bool(rewards & {"imagereward", "hpsv2"})
    bad = FAIL if needed else WARN
    base = torch.__version__.split("+")[0]
    tv = matching_torchvision(torch.__version__)
    pin = f'pip install "torch==={base}" "torchvision=={tv}"' if tv else "install the torchvision release built for this torch"
    if importlib.util.find_spec("torchvision") is None:
        return Check("torchvision", bad, "not installed (imagereward and hpsv2 need it)",
                     f"{pin}  (or pip install \"solrl[rewards]\" with a matching torch)", needed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchvision
    except Exception as exc:  # noqa: BLE001 - an ABI mismatch surfaces as RuntimeError/OSError/ImportError
        cpu = "+cpu" in torch.__version__
        why = (f"torch {torch.__version__} is a CPU-only (+cpu) wheel and PyPI's torchvision is built against PyPI's "
               "CUDA torch, so the two do not import together; PyPI's CUDA torch runs on a CPU too" if cpu else
               f"this torchvision was not built for torch {torch.__version__}")
        return Check("torchvision", bad, f"does not import next to torch {torch.__version__} "
                     f"({type(exc).__name__}: {hardware._first_line(exc)}): {why}", pin, needed)
    return Check("torchvision", PASS, f"torchvision {torchvision.__version__} imports next to torch {torch.__version__}", "",
                 needed)


# --- rewards ---------------------------------------------------------------------------------------

def _probe_imagereward() -> None:
    importlib.import_module("solrl_core.rewards.imagereward")
    from solrl_core.rewards.compat import import_image_reward

    import_image_reward()


def _probe_clip() -> None:
    importlib.import_module("solrl_core.rewards.clip_rewards")


def _probe_hpsv2() -> None:
    importlib.import_module("open_clip")
    importlib.import_module("solrl_core.rewards.hpsv2")


# (row name, the rewards it serves, probe, fix)
BACKENDS: tuple[tuple[str, tuple[str, ...], Callable[[], None], str], ...] = (
    ("imagereward", ("imagereward",), _probe_imagereward, 'pip install "solrl[rewards]" (image-reward 1.5, timm 0.6.13)'),
    ("pickscore, clipscore", ("pickscore", "clipscore"), _probe_clip, "pip install transformers  (a core dependency)"),
    ("hpsv2", ("hpsv2",), _probe_hpsv2, 'pip install "solrl[rewards]" (open-clip-torch)'),
)


def _reward_backends(rewards: set[str]) -> list[Check]:
    out = []
    for label, serves, probe, fix in BACKENDS:
        needed = bool(rewards & set(serves))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                probe()
        except Exception as exc:  # noqa: BLE001 - any import failure is the answer
            out.append(Check(f"reward backend {label}", FAIL if needed else WARN,
                             f"does not import: {type(exc).__name__}: {hardware._first_line(exc)}", fix, needed))
        else:
            out.append(Check(f"reward backend {label}", PASS, "imports", "", needed))
    return out


def _cached(repo: str, names: tuple[str, ...], cache: Path) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo, n, cache_dir=cache), str) for n in names)


def _reward_weights(cfg: Config, m: _Machine) -> tuple[list[Check], float]:
    out, download = [], 0.0
    for name in cfg.reward.weights:
        row = f"reward weights {name}"
        if name not in REWARD_FILES:
            out.append(Check(row, PASS, "needs no weights", "", True))
            continue
        local = cfg.reward.paths.get(name, "")
        needs = REWARD_FILES[name]
        if local:
            path = Path(local).expanduser()
            files = REWARD_LOCAL_FILES[name]
            folder = path.parent if path.is_file() else path
            lacking = [f for f in files if not (folder / f).exists()]
            if not path.exists() or lacking:
                out.append(Check(row, FAIL, f"reward.paths.{name} = {local} " + ("does not exist" if not path.exists() else
                                 f"lacks {', '.join(lacking)}"), f"point it at a folder holding {', '.join(files)}", True))
                continue
            if name == "imagereward" and not (folder / "tokenizer").is_dir():
                needs = tuple(n for n in needs if n[0] == "bert-base-uncased")  # the tokenizer still comes from the hub
            else:
                out.append(Check(row, PASS, f"local folder {folder}", "", True))
                continue
        missing = [(repo, names) for repo, names in needs if not _cached(repo, names, m.cache)]
        if not missing:
            out.append(Check(row, PASS, f"in the Hugging Face cache ({', '.join(dict.fromkeys(r for r, _ in needs))})", "", True))
            continue
        what = ", ".join(f"{repo}/{'|'.join(names)}" for repo, names in missing)
        local_fix = f"--set reward.paths.{name}=DIR with {', '.join(REWARD_LOCAL_FILES[name])}"
        if m.offline:
            out.append(Check(row, FAIL, f"not in the Hugging Face cache ({m.cache}) and HF_HUB_OFFLINE=1: missing {what}",
                             f"download hub {', '.join(dict.fromkeys(r for r, _ in missing))} once with network (unset HF_HUB_OFFLINE), "
                             f"or {local_fix}", True))
        else:
            size = REWARD_DOWNLOAD_GB.get(name, 0.0)
            download += size
            out.append(Check(row, WARN, f"not cached; will download on first use (~{size:.1f} GB, approximate): {what}",
                             f"nothing to do with network access; offline: {local_fix}", True))
    return out, download


# --- the base model --------------------------------------------------------------------------------

def _model_weights(cfg: Config, m: _Machine) -> tuple[Check, float]:
    """The model-weights check, and how many GB (approximate) still have to be downloaded."""
    mc = cfg.model
    row = "model weights"
    if mc.loader == "tiny":
        if not mc.weights:
            return Check(row, PASS, f"tiny model at random init (seed {mc.init_seed}): nothing to load", "", True), 0.0
        shipped = Path(str(resources.files("solrl_core.models"))) / mc.weights
        folder = Path(mc.weights) if Path(mc.weights).is_dir() else shipped
        missing = [f for f in ("config.json", "model.safetensors") if not (folder / f).is_file()]
        if missing:
            return Check(row, FAIL, f"tiny model weights '{mc.weights}' lack {', '.join(missing)} ({folder})",
                         "give a folder holding config.json and model.safetensors in model.weights, or leave it empty", True), 0.0
        origin = "shipped with solrl" if folder == shipped else "local folder"
        return Check(row, PASS, f"tiny model '{mc.weights}' ({origin}: {folder})", "", True), 0.0
    from solrl_core.models.diffusers_models import LAYOUTS, missing_part

    layout = LAYOUTS.get(mc.loader)
    if layout is None:
        return Check(row, FAIL, f"unknown model loader '{mc.loader}'", "model.loader must be one of: tiny, " + ", ".join(LAYOUTS), True), 0.0
    size = model_size(cfg)
    local_fix = f"pass a local {layout.name} diffusers folder with --model-path DIR"
    if mc.path:
        folder = Path(mc.path).expanduser()
        lacking = missing_part(folder, layout) if folder.is_dir() else "the folder itself"
        if lacking:
            return Check(row, FAIL, f"model.path {folder} lacks {lacking}",
                         f"use the hub's diffusers layout, e.g. `hf download {mc.hub_id or '<hub id>'} --local-dir DIR`", True), 0.0
        return Check(row, PASS, f"local folder {folder} (model_index.json and every component)", "", True), 0.0
    if not mc.hub_id:
        return Check(row, FAIL, "model.hub_id and model.path are both empty", "set model.hub_id, or --model-path DIR", True), 0.0
    from huggingface_hub import try_to_load_from_cache

    gated = f"; the repository is gated: {GATED_HINT.format(repo=mc.hub_id)}" if layout.gated else ""
    cached = try_to_load_from_cache(mc.hub_id, "model_index.json", cache_dir=m.cache)
    lacking = missing_part(Path(cached).parent, layout) if isinstance(cached, str) else None
    if isinstance(cached, str) and lacking is None:
        return Check(row, PASS, f"{mc.hub_id} is in the Hugging Face cache ({Path(cached).parent})", "", True), 0.0
    state = f"an incomplete snapshot is cached (lacks {lacking})" if isinstance(cached, str) else "not in the Hugging Face cache"
    if m.offline:
        return Check(row, FAIL, f"{mc.hub_id}: {state} ({m.cache}) and HF_HUB_OFFLINE=1",
                     f"download {mc.hub_id} once with network (unset HF_HUB_OFFLINE), or {local_fix}{gated}", True), 0.0
    return Check(row, WARN, f"{mc.hub_id}: {state}; will download on first use (~{size.download_gb:.0f} GB, approximate)",
                 f"nothing to do with network access; offline: {local_fix}{gated}", True), size.download_gb


def _has_token() -> bool:
    from huggingface_hub import constants

    if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return True
    return Path(constants.HF_TOKEN_PATH).is_file()  # `hf auth login` writes it; read without any network call


def _hub_token(cfg: Config, model_download: float) -> list[Check]:
    from solrl_core.models.diffusers_models import LAYOUTS

    layout = LAYOUTS.get(cfg.model.loader)
    if layout is None or not layout.gated or cfg.model.path:
        return []
    if _has_token():
        return [Check("hub token", PASS, f"{cfg.model.hub_id} is gated; a Hugging Face token is set", "", model_download > 0)]
    if model_download <= 0:
        return [Check("hub token", PASS, f"{cfg.model.hub_id} is gated, but its weights need no download here", "", False)]
    return [Check("hub token", FAIL, f"{cfg.model.hub_id} is gated and no Hugging Face token is set (HF_TOKEN)",
                  GATED_HINT.format(repo=cfg.model.hub_id), True)]


def _hub_mode(m: _Machine) -> Check:
    if m.offline:
        return Check("hub mode", PASS, f"HF_HUB_OFFLINE=1: only weights already in the cache ({m.cache}) are used", "", False)
    return Check("hub mode", PASS, f"online: missing weights download into {m.cache} on first use", "", False)


def _disk(m: _Machine, model_gb: float, reward_gb: float, cfg: Config) -> Check:
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


# --- processes, memory and precision ---------------------------------------------------------------

def _processes(nproc: int, m: _Machine, gpu: GpuInfo | None) -> Check:
    if gpu is None:
        if nproc == 1:
            return Check("processes", PASS, "1 process on the CPU", "", True)
        return Check("processes", WARN, f"{nproc} processes on the CPU share its cores", "--nproc-per-node 1", True)
    n = len(m.gpus)
    if nproc <= n:
        return Check("processes", PASS, f"{nproc} process(es), {n} GPU(s): one GPU each", "", True)
    return Check("processes", FAIL, f"{nproc} processes asked for, but this machine has {n} GPU(s) (one per process)",
                 f"--nproc-per-node {n}", True)


def _fitting_precisions(cfg: Config, gpu: GpuInfo, dtype_name: str) -> str:
    """The explore precisions usable on this GPU whose estimate fits in its memory, as a fix hint."""
    usable = [p for p in hardware.supported(hardware.explore_precisions(gpu)) if p in hardware.IMPLEMENTED_EXPLORE]
    fits = [(p, estimate_memory(cfg, p, dtype_name).peak) for p in usable]
    fits = [f"--explore-precision {p} (estimate {peak:.0f} GiB{', no separate copy' if p == dtype_name else ''})"
            for p, peak in fits if peak <= gpu.memory_gib]
    if not fits:
        return "; no explore precision usable here fits by this estimate"
    return "; fits here by this estimate: " + ", ".join(fits)


def _memory_without_gpu(cfg: Config, requested: str | None) -> Check:
    """No GPU here: a real model still gets the estimate of a bf16 GPU run (explore copy as asked,
    fp8 for auto), so its memory needs are known before a GPU is chosen."""
    check = _memory(cfg, None, requested)
    if cfg.model.loader == "tiny":
        return check
    precision = requested if requested in hardware.IMPLEMENTED_EXPLORE else "fp8"
    est = estimate_memory(cfg, precision, "bf16")
    detail = (f"{check.detail}; on a GPU in bf16 with a {precision} explore copy: estimate {est.peak:.1f} GiB "
              f"({model_size(cfg).label}, approximate): policy {est.policy:.1f} + explore copy {est.explore_copy:.1f} + "
              f"vae {est.vae:.1f} + max(text encoders {est.text_encoders:.1f}, activations {est.activations:.1f} for "
              f"micro-batch {cfg.optimizer.micro_batch}) + {est.overhead:.1f} overhead")
    return dataclasses.replace(check, detail=detail)


def _memory(cfg: Config, gpu: GpuInfo | None, requested: str | None) -> Check:
    if gpu is None:
        return Check("memory estimate", PASS, "skipped: no GPU (the run uses the CPU's memory)", "", False)
    import torch

    from solrl_core.precision.resolve import resolve_machine

    precision = requested if requested in set(EXPLORE_PRECISIONS) | set(hardware.PRECISIONS) else "auto"
    dtype_name = "bf16" if cfg.run.dtype == "auto" else cfg.run.dtype
    asked = dataclasses.replace(cfg, explore=dataclasses.replace(cfg.explore, precision=precision))
    machine = resolve_machine(asked, torch.device("cuda", gpu.index), dtype_name, gpu=gpu)
    est = estimate_memory(asked, machine.explore_precision, dtype_name, machine.checkpointing, machine.rollout_copy)
    detail = (f"estimate {est.peak:.1f} GiB of {gpu.memory_gib:.0f} GiB on cuda:{gpu.index} ({model_size(cfg).label}, "
              f"approximate): policy {est.policy:.1f} + explore copy {est.explore_copy:.1f} ({machine.explore_precision}) "
              f"+ rollout copy {est.rollout_copy:.1f} + vae {est.vae:.1f} + max(text encoders {est.text_encoders:.1f}, "
              f"activations {est.activations:.1f} for micro-batch {cfg.optimizer.micro_batch}, gradient checkpointing "
              f"{'on' if machine.checkpointing else 'off'}) + {est.overhead:.1f} overhead; "
              f"rollout copy: {machine.rollout_copy_why}; torch.compile: "
              + ", ".join(f"{name} {'on' if on else 'off'}" for name, on in (
                  ("explore copy", machine.explore_compile), ("rollout copy", machine.rollout_compile),
                  ("update", machine.update_compile))))
    fix = ("lower optimizer.micro_batch (--set optimizer.micro_batch=N), use a GPU with more memory, or an explore "
           "precision with a smaller copy")
    if est.peak > gpu.memory_gib:
        return Check("memory estimate", FAIL, detail, fix + _fitting_precisions(cfg, gpu, dtype_name), True)
    if est.peak > 0.9 * gpu.memory_gib:
        return Check("memory estimate", WARN, detail + " (within 10%)", fix, True)
    return Check("memory estimate", PASS, detail, "", True)


def _explore(cfg: Config, gpu: GpuInfo | None, requested: str | None) -> Check:
    from solrl_core.precision.resolve import auto_explore_precision

    requested = requested or cfg.explore.precision
    family = cfg.algorithm.family
    uses = family in EXPLORE_FAMILIES
    known = list(dict.fromkeys((*EXPLORE_PRECISIONS, *hardware.PRECISIONS)))
    if requested not in known:
        return Check("explore precision", FAIL, f"unknown explore precision '{requested}'", f"choose one of: {', '.join(known)}",
                     True)
    dtype_name = ("bf16" if gpu is not None else "fp32") if cfg.run.dtype == "auto" else cfg.run.dtype
    if requested == "auto":
        resolved, auto_why = auto_explore_precision(gpu, dtype_name)
    else:
        resolved, auto_why = requested, ""
    precisions = hardware.explore_precisions(gpu)
    ok, why = precisions.get(resolved, (False, "not a precision solrl knows"))
    where = f"cuda:{gpu.index} ({gpu.name})" if gpu is not None else "the CPU"
    name = requested if resolved == requested else f"{requested} -> {resolved}"
    unused = "" if uses else f"; the {family} family does not use it (its rollouts run at full precision)"
    here = hardware.supported(precisions)
    if not ok:
        usable = [p for p in here if p in hardware.IMPLEMENTED_EXPLORE] or here
        fix = f"this machine supports: {', '.join(here)}; use --explore-precision {usable[0]}"
        return Check("explore precision", FAIL if uses else WARN, f"{name} is not supported on {where}: {why}{unused}", fix, uses)
    if resolved not in hardware.IMPLEMENTED_EXPLORE:
        return Check("explore precision", WARN, f"{name} runs on {where} ({why}), but this solrl's rollouts do not use it "
                     f"yet (implemented: {', '.join(hardware.IMPLEMENTED_EXPLORE)}){unused}",
                     "use --explore-precision fp8 (Ada, Hopper, Blackwell) or nvfp4-emulated for now", uses)
    chosen = f" ({auto_why})" if auto_why else ""
    return Check("explore precision", PASS, f"{name} on {where}: {why}{chosen}{unused}", "", uses)
