"""The real models (SANA, FLUX.1, SD3/3.5) loaded with diffusers behind `DiffusionModel`.

Where the weights come from: `model.path`, a local folder in the hub's diffusers layout
(model_index.json plus one subfolder per component), or else `model.hub_id` through the Hugging
Face cache: a complete cached snapshot is used without contacting the hub (so `HF_HUB_OFFLINE=1`
works, and a run keeps the revision it started with); otherwise only `model_index.json` and the
subfolders the model needs are downloaded, in one weight variant (the run dtype's when the repo has
it). The folder is checked for every file the model needs before anything is loaded, and each
component is loaded on its own with `from_pretrained(folder, subfolder=...)`.

Precision and memory, per model:
- the transformer and the VAE run in the run dtype (bf16 on CUDA, fp32 on CPU), as diffusers'
  pipelines do when loaded with `torch_dtype=torch.bfloat16` (gradient checkpointing is the session's
  choice, from the memory estimate: resolve.py);
- the text encoders are loaded in the run dtype and kept on the CPU: `encode` moves them to the
  run device, encodes, and moves them back, so they take no GPU memory between calls (the session
  encodes each prompt once per run and caches the conditioning, on the CPU);
- `decode` runs the VAE in chunks of `DECODE_CHUNK` images.

Sampling always goes through solrl's own sampler (seeded noise of `latent_shape`, our sigma grid),
so each model only provides its transformer call (`velocity`), in the convention x_sigma =
(1 - sigma) x0 + sigma eps, v = eps - x0, which all three models predict natively.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from solrl_core.config.schema import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning, DiffusionModel

DECODE_CHUNK = 4  # images per VAE decode call: a 1024px decode holds GBs of activations per image

# A weight file of a component folder: plain, sharded, or a variant ("model.bf16-00001-of-00002.safetensors").
_WEIGHT = re.compile(r"^(?P<stem>diffusion_pytorch_model|model|pytorch_model)"
                     r"(?:\.(?P<v1>bf16|fp16|fp32))?(?:-\d+-of-\d+)?\.(?P<fmt>safetensors|bin)"
                     r"(?:\.index(?:\.(?P<v2>bf16|fp16|fp32))?\.json)?$")
_SMALL_FILES = (".json", ".txt", ".model", ".jinja")  # configs, tokenizer vocabularies (vocab.json, merges.txt,
# spiece.model) and chat templates (chat_template.jinja: the Qwen tokenizers of Z-Image and Qwen-Image)


@dataclass(frozen=True)
class Layout:
    """What one model needs from a diffusers folder, and which code builds it."""

    name: str  # shown to the user
    models: tuple[str, ...]  # subfolders holding config.json and weights
    tokenizers: tuple[str, ...]  # subfolders holding tokenizer_config.json
    gated: bool  # the hub repo asks for a licence acceptance and a token
    builder: Callable[["Components"], DiffusionModel]  # builds the DiffusionModel from the folder's components
    pipeline: str  # the diffusers pipeline class whose save_lora_weights / load_lora_weights the LoRA follows

    @property
    def subfolders(self) -> tuple[str, ...]:
        return self.models + self.tokenizers


def load_diffusers_model(cfg: ModelConfig, layout: Layout, device: torch.device, dtype: torch.dtype) -> DiffusionModel:
    """The model of `cfg` from its diffusers folder (model.path or the hub), built as `layout` says
    (models/layouts.py holds every model's layout)."""
    folder = model_folder(cfg, layout, dtype)
    check_layout(folder, layout, cfg)
    return layout.builder(Components(folder, cfg, device, dtype))


# --- where the folder comes from -------------------------------------------------------------------

def model_folder(cfg: ModelConfig, layout: Layout, dtype: torch.dtype) -> Path:
    """`model.path`, or the hub snapshot of `model.hub_id` (downloaded or cached)."""
    if cfg.path:
        folder = Path(cfg.path).expanduser()
        if not folder.is_dir():
            raise SolrlError(f"model.path {folder} is not a folder",
                             f"give a local {layout.name} diffusers folder (model_index.json, "
                             f"{', '.join(layout.subfolders)})")
        return folder
    if not cfg.hub_id:
        raise SolrlError(f"no weights given for the {layout.name} model (model.hub_id and model.path are both empty)",
                         "set model.hub_id, or pass a local diffusers folder with --model-path DIR")
    return _hub_folder(cfg.hub_id, layout, dtype)


def _hub_folder(hub_id: str, layout: Layout, dtype: torch.dtype) -> Path:
    """A complete cached snapshot is used without asking the hub (offline-friendly, and a run keeps
    the weights it started with); otherwise the needed files are downloaded."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError

    cached = try_to_load_from_cache(hub_id, "model_index.json")
    if isinstance(cached, str) and missing_part(Path(cached).parent, layout) is None:
        return Path(cached).parent
    reason = "HF_HUB_OFFLINE is set"
    if not constants.HF_HUB_OFFLINE:
        try:
            return _download(hub_id, layout, dtype)
        except GatedRepoError as exc:
            raise SolrlError(f"{hub_id} is a gated repository and this machine has no access to it "
                             f"({_first_line(exc)})",
                             _fix(hub_id, layout)) from exc
        except Exception as exc:  # noqa: BLE001 - no network, unknown repo, hub down: say so with the fix
            reason = f"{type(exc).__name__}: {_first_line(exc)}"
    if isinstance(cached, str):  # an incomplete snapshot: check_layout names what is missing
        return Path(cached).parent
    raise SolrlError(f"the {layout.name} weights '{hub_id}' are not in the Hugging Face cache "
                     f"({constants.HF_HUB_CACHE}) and could not be downloaded ({reason})", _fix(hub_id, layout))


def _fix(hub_id: str, layout: Layout) -> str:
    fix = (f"connect to the hub once to download {hub_id}, or pass a local diffusers folder with --model-path DIR "
           f"(--set model.path=DIR)")
    if layout.gated:
        fix += ("; the repository is gated: accept its licence on huggingface.co and set HF_TOKEN (or run `hf auth "
                "login`)")
    return fix


def _download(hub_id: str, layout: Layout, dtype: torch.dtype) -> Path:
    from huggingface_hub import HfApi, snapshot_download

    # model_info is one request (no retry loop), so a machine without network fails fast here.
    info = HfApi().model_info(hub_id, timeout=15)
    wanted = select_files([s.rfilename for s in info.siblings or []], layout.subfolders, dtype)
    return Path(snapshot_download(hub_id, revision=info.sha, allow_patterns=wanted))


def select_files(files: list[str], subfolders: tuple[str, ...], dtype: torch.dtype) -> list[str]:
    """The repository files a model needs: model_index.json, and for each subfolder its config and
    tokenizer files plus one set of weights (the run dtype's variant if there is one, else the plain
    files). Root checkpoints (e.g. FLUX's flux1-dev.safetensors), other frameworks' weights (flax,
    onnx) and unused variants are never downloaded."""
    out = ["model_index.json"]
    for sub in subfolders:
        names = [f.split("/", 1)[1] for f in files if f.startswith(sub + "/") and "/" not in f.split("/", 1)[1]]
        out += [f"{sub}/{n}" for n in names if not _WEIGHT.match(n) and n.endswith(_SMALL_FILES)]
        variant, fmt = weight_choice(names, dtype)
        out += [f"{sub}/{n}" for n in names if _weight_key(n) == (variant, fmt)]
    return out


def _weight_key(name: str) -> tuple[str | None, str] | None:
    m = _WEIGHT.match(name)
    return (m["v1"] or m["v2"], m["fmt"]) if m else None


def weight_choice(names: list[str], dtype: torch.dtype) -> tuple[str | None, str]:
    """(variant, format) of the weights to load from a component folder's file names."""
    present = {k for k in map(_weight_key, names) if k}
    native = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    order = [native, None, "bf16", "fp16", "fp32"]
    for fmt in ("safetensors", "bin"):
        for variant in order:
            if (variant, fmt) in present:
                return variant, fmt
    return None, "safetensors"


# --- the folder itself --------------------------------------------------------------------------------

def missing_part(folder: Path, layout: Layout) -> str | None:
    """What the folder lacks for this model (None: nothing)."""
    if not (folder / "model_index.json").is_file():
        return "model_index.json (not a diffusers pipeline folder)"
    for sub in layout.subfolders:
        if not (folder / sub).is_dir():
            return f"the {sub}/ subfolder"
    for sub in layout.models:
        if not (folder / sub / "config.json").is_file():
            return f"{sub}/config.json"
        if not any(_WEIGHT.match(p.name) for p in (folder / sub).iterdir()):
            return f"the weights in {sub}/ (diffusion_pytorch_model*.safetensors or model*.safetensors)"
    for sub in layout.tokenizers:
        if not (folder / sub / "tokenizer_config.json").is_file():
            return f"{sub}/tokenizer_config.json"
    return None


def check_layout(folder: Path, layout: Layout, cfg: ModelConfig) -> None:
    """Every file the model needs is there, before loading anything (one error naming what is not)."""
    missing = missing_part(folder, layout)
    if missing is None:
        return
    origin = f"model.path {folder}" if cfg.path else f"the cached snapshot of {cfg.hub_id} ({folder})"
    fix = ("use the hub's diffusers layout, e.g. `hf download " + (cfg.hub_id or "<hub id>") + " --local-dir DIR`"
           if cfg.path else "it is incomplete: run once with network access to complete it, or pass --model-path DIR")
    raise SolrlError(f"{origin} is missing {missing}, which the {layout.name} model needs", fix)


class Components:
    """Loads one component at a time from a checked folder, in the run dtype, with clear errors."""

    def __init__(self, folder: Path, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        self.folder, self.cfg, self.device, self.dtype = folder, cfg, device, dtype
        self.origin = cfg.path or cfg.hub_id

    def model(self, cls: type, sub: str) -> Any:
        """A diffusers or transformers model class from `sub`, on the CPU, eval mode, no gradients."""
        names = [p.name for p in (self.folder / sub).iterdir()]
        variant, fmt = weight_choice(names, self.dtype)
        kwargs: dict[str, Any] = {"subfolder": sub, "use_safetensors": fmt == "safetensors"}
        if variant:
            kwargs["variant"] = variant
        kwargs["torch_dtype" if cls.__module__.startswith("diffusers") else "dtype"] = self.dtype
        try:
            module = cls.from_pretrained(str(self.folder), **kwargs)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
            raise SolrlError(f"cannot load {sub}/ of {self.origin} as {cls.__name__}: {_first_line(exc)}",
                             "check that the folder is a diffusers pipeline of the model the preset names") from exc
        return module.requires_grad_(False).eval()

    def tokenizer(self, sub: str) -> Any:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(self.folder / sub))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SolrlError(f"cannot load the tokenizer in {sub}/ of {self.origin}: {_first_line(exc)}",
                             "check that the folder is a diffusers pipeline of the model the preset names") from exc

    def transformer(self, cls: type) -> nn.Module:
        return self.model(cls, "transformer").to(self.device)  # gradient checkpointing: the session decides

    def vae(self, cls: type) -> Any:
        return self.model(cls, "vae").to(self.device)

    def latent_side(self, multiple: int, vae_factor: int) -> int:
        """Latent side for model.resolution, which must be a multiple of `multiple` pixels."""
        res = self.cfg.resolution
        if res % multiple:
            raise SolrlError(f"model.resolution={res} must be a multiple of {multiple} for this model "
                             f"(VAE downsampling {vae_factor} x transformer patch)",
                             f"use e.g. --set model.resolution={max(multiple, res - res % multiple)}")
        return res // vae_factor

    def describe(self, name: str, transformer: nn.Module, latent_shape: tuple[int, ...]) -> str:
        params = sum(p.numel() for p in transformer.parameters())
        size = next(f"{params / d:.2f}{u}" for d, u in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")) if params >= d or d
                    == 1)
        return (f"{name} {size} transformer from {self.origin}, {self.cfg.resolution}px, "
                f"latent {'x'.join(map(str, latent_shape))}")


class TextEncoders:
    """Text encoders that live on the CPU and visit the run device only while they encode."""

    def __init__(self, modules: list[nn.Module], device: torch.device) -> None:
        self.modules, self.device = modules, device

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        if self.device.type == "cpu":
            with torch.no_grad():
                yield
            return
        for m in self.modules:
            m.to(self.device)
        try:
            with torch.no_grad():
                yield
        finally:
            for m in self.modules:
                m.to("cpu")
            torch.cuda.empty_cache()


def trim_padding(cond: Conditioning) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's text embeddings and mask cut to its longest prompt (the encoders pad every prompt
    to the model's max_sequence_length so that prompts encoded apart batch together)."""
    length = max(int(cond.mask.sum(dim=1).max()), 1)
    return cond.embeds[:, :length], cond.mask[:, :length].to(cond.embeds.device)


def scaled_decode(vae: Any, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """latents -> images through `vae`, undoing its scaling factor (and shift factor, where it has one)
    as the pipelines do, in chunks."""
    scaling, shift = vae.config.scaling_factor, getattr(vae.config, "shift_factor", None) or 0.0
    return lambda latents: chunked_decode(
        lambda z: vae.decode(z.to(device, vae.dtype) / scaling + shift, return_dict=False)[0], latents)


def chunked_decode(vae_decode: Callable[[torch.Tensor], torch.Tensor], latents: torch.Tensor) -> torch.Tensor:
    """VAE output in [-1, 1] -> images [B, 3, H, W] float32 in [0, 1], DECODE_CHUNK images at a time."""
    out = []
    with torch.no_grad():
        for start in range(0, latents.shape[0], DECODE_CHUNK):
            images = vae_decode(latents[start:start + DECODE_CHUNK])
            out.append((images.float() / 2 + 0.5).clamp(0.0, 1.0))
    return torch.cat(out)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
