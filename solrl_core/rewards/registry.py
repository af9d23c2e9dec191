"""Every reward solrl can use, declared once: the built-ins below, the plugins installed packages
declare (entry-point group `solrl.rewards`), and a plugin named by where it lives
(`mypkg.rewards:ocr`, `path/to/file.py:score`). Torch-free, so a config can be checked and
`solrl presets` can list the rewards without loading torch: a builder imports its backend only
when it is called.

Each other place that needs a fact about a reward reads it from here: the builders
(rewards/__init__.py), the doctor's weight checks (doctor/weights.py), its checks of the reward
backends and torchvision and their install hints (doctor/software.py), the download sizes, the
reward presets `solrl presets` lists and `--reward NAME` resolves (presets.py), the best score
reward health knows (rewards/health.py), the descriptions a reward server publishes. Loading and
checking a plugin is rewards/plugins.py; the interface a reward implements is in the docstring of
rewards/__init__.py and in docs/rewards.md.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from solrl_core.errors import SolrlError

GROUP = "solrl.rewards"  # the entry-point group installed plugins declare their rewards in
_IDENT = r"[A-Za-z_]\w*"
_MODULE = re.compile(rf"{_IDENT}(\.{_IDENT})*")
_NUMBER = re.compile(r"\s*[-+]?[0-9.]+([eE][-+]?[0-9]+)?\s*")

# (hub repository, files: any one of them cached will do)
HubFiles = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class Backend:
    """A library rewards score with, declared once for every reward that uses it: the doctor imports
    it once for all of them and, where it does not import, says how to install it."""

    probe: Callable[[], None]  # imports it as a run would (compat shims included); raises where it cannot
    install: str  # the fix where it does not import
    torchvision: bool = False  # it imports torchvision, which must be the release built for this torch


@dataclass(frozen=True)
class Floor:
    """How far a reward, scored as an eval reward, must fall before the fall counts as reward hacking
    (loop/hacking.py: it must also be more than two paired standard errors): `value` in the reward's
    own units, or, `of_spread`, that fraction of its standard deviation over the base evaluation's
    images. `reason`: how it was chosen (docs/rewards.md gives the measurements)."""

    value: float
    reason: str
    of_spread: bool = False

    def resolve(self, base_std: float) -> float:
        return self.value * base_std if self.of_spread else self.value


# A reward that declares no floor of its own (plugins, URL rewards): half its spread over the base images.
PLUGIN_FLOOR = Floor(0.5, "declares none: half its standard deviation over the base evaluation's images, unless "
                          "run.hacking_floors sets one", of_spread=True)


@dataclass(frozen=True)
class RewardInfo:
    """One reward: what it is, what it needs and how it is built. Sizes are APPROXIMATE."""

    name: str
    description: str
    build: Callable[[Any], Any] | None = None  # RewardContext -> Reward; None: a plugin (rewards/plugins.py loads it)
    weights: str = ""  # where the weights come from, for errors and `doctor`; '' = needs none
    extra: str = ""  # the pip extra that installs its backend; '' = core install
    # the highest score it can give, when bounded: every image there is saturation, not a fault
    best: float | None = None
    media: str = "image"  # what it judges: "image" ([B, 3, H, W] in [0, 1]) or "video" (clips [B, F, 3, H, W]); a video
    # reward refuses an image model's run (names.check_media)
    # an image reward on a video model's run scores sampled frames of each clip (rewards/video.py);
    on_frames: bool = True
    # False: it judges only a still model's images and refuses a video run
    backend: Backend | None = None  # the library it scores with beyond torch; None: nothing to check
    hub_files: HubFiles = ()  # what it downloads from the hub (doctor looks for them in the cache)
    local_files: tuple[str, ...] = ()  # what a local folder given as reward.paths.NAME must hold
    hub_unless_local: tuple[tuple[str, str], ...] = ()  # (hub repository, subfolder): fetched from the hub even with a
    # local folder, unless that folder holds the subfolder
    download_gb: float = 0.0  # size of that download, GB (approximate)
    memory_gib: float = 0.0  # its weights on the device in fp32, GiB (approximate; activations not counted)
    plugin: str = ""  # a plugin's target: 'module:attr' or 'path/file.py:attr' ('' for a built-in)
    origin: str = "built-in"  # where it was declared, for listings and errors
    # its hacking floor as an eval reward; every built-in declares one (tests/test_hacking.py)
    floor: Floor | None = None

    @property
    def needs_weights(self) -> bool:
        return bool(self.weights)

    @property
    def install(self) -> str:
        """How to install what it imports: the fix where its backend does not import."""
        return self.backend.install if self.backend is not None else "pip install solrl"


# --- the built-ins: each builder imports its backend only when called -------------------------------

def _jpeg(name: str, sign: float, scale: float) -> Callable[[Any], Any]:
    def build(ctx: Any) -> Any:
        from solrl_core.rewards.jpeg import JpegSize

        return JpegSize(name, sign=sign, scale=scale)
    return build


def _tinyworld(ctx: Any) -> Any:
    from solrl_core.rewards.tinyworld import TinyWorldReward

    return TinyWorldReward()


def _tinyvideo(ctx: Any) -> Any:
    from solrl_core.rewards.tinyvideo import TinyVideoReward

    return TinyVideoReward()


def _fidelity(ctx: Any) -> Any:
    from solrl_core.rewards.palette import PaletteFidelity

    return PaletteFidelity()


def _brightness(ctx: Any) -> Any:
    from solrl_core.rewards.brightness import Brightness

    return Brightness()


def _imagereward(ctx: Any) -> Any:
    from solrl_core.rewards.imagereward import ImageRewardScore

    return ImageRewardScore.load(ctx)


def _pickscore(ctx: Any) -> Any:
    from solrl_core.rewards.clip_rewards import PickScore

    return PickScore.load(ctx)


def _clipscore(ctx: Any) -> Any:
    from solrl_core.rewards.clip_rewards import ClipScore

    return ClipScore.load(ctx)


def _temporal(ctx: Any) -> Any:
    from solrl_core.rewards.temporal import TemporalConsistency

    return TemporalConsistency.load(ctx)


def _hpsv2(ctx: Any) -> Any:
    from solrl_core.rewards.hpsv2 import HPSv2

    return HPSv2.load(ctx)


# --- the backends: each probe imports what the builders above import, without loading weights ----------

def _probe_imagereward() -> None:
    from solrl_core.rewards.compat import import_image_reward

    importlib.import_module("solrl_core.rewards.imagereward")
    import_image_reward()


def _probe_clip() -> None:
    importlib.import_module("solrl_core.rewards.clip_rewards")


def _probe_open_clip() -> None:
    importlib.import_module("open_clip")
    importlib.import_module("solrl_core.rewards.hpsv2")


IMAGE_REWARD = Backend(_probe_imagereward, 'pip install "solrl[rewards]" (image-reward 1.5, timm 0.6.13)',
                       torchvision=True)
CLIP = Backend(_probe_clip, "pip install transformers  (a core dependency)")
OPEN_CLIP = Backend(_probe_open_clip, 'pip install "solrl[rewards]" (open-clip-torch)', torchvision=True)

_CLIP_L = "openai/clip-vit-large-patch14"
# The hacking floors (Floor): how each was chosen is in docs/rewards.md ("How the floors were chosen").
_SIZE_FLOOR = Floor(0.5, "its scale follows the image size, so no one number fits: half its standard deviation over "
                         "the base evaluation's images", of_spread=True)
_GENEVAL_FLOOR = Floor(0.02, "under half the default tiny run's held-out gain (+0.046 +- 0.006): a fall that undoes "
                             "half of what training buys, about three standard errors of a 1,952-image evaluation")


def _paper(gain: float, figures: str) -> Floor:
    """A tenth of the gain the paper reports training FLUX.1 with Sol-RL on this reward (REFERENCE figures)."""
    return Floor(round(gain / 10, 4), f"a tenth of the gain the paper reports for Sol-RL on FLUX.1 ({figures}): about "
                                      f"the "
                                      "margin between the methods it compares (ImageReward: Sol-RL 1.764, DiffusionNFT "
                                      "1.671)")

_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_TOKENIZER = ("tokenizer.json", "vocab.json")
BUILTINS: tuple[RewardInfo, ...] = (
    RewardInfo("jpeg_compressibility", "Smaller JPEG files score higher: -size_KB / 500 (PIL, quality 95)",
               _jpeg("jpeg_compressibility", -1.0, 1 / 500), floor=_SIZE_FLOOR),
    RewardInfo("jpeg_incompressibility", "Larger JPEG files score higher: +size_KB (PIL, quality 95)",
               _jpeg("jpeg_incompressibility", 1.0, 1.0), floor=_SIZE_FLOOR),
    RewardInfo("tinyworld_geneval", "GenEval-style partial score of a tiny-world image against its caption (objects, "
               "colours, counts, positions), in [0, 1]", _tinyworld, best=1.0, on_frames=False, floor=_GENEVAL_FLOOR),
    RewardInfo("tinyvideo_geneval", "Video: GenEval-style partial score of a tiny-moving-world clip against its "
               "caption (object, colour, count, motion), in [0, "
               "1]", _tinyvideo, best=1.0, media="video", floor=_GENEVAL_FLOOR),
    RewardInfo("tinyworld_fidelity", "Share of a tiny-world image painted in the tiny world's seven colours: per pixel "
               "max(0, 1 - RGB distance to the nearest / 64), averaged, in [0, 1]; falls as images wash out, blur or "
               "get noisy (an eval reward of the tiny preset)", _fidelity, best=1.0, on_frames=False,
               floor=Floor(0.1, "what on exact paint Gaussian noise of 4 of 255 levels costs (0.100), or a 3x3 blur "
                                "(0.118), or every pixel 4 levels brighter (0.108): twice the default tiny run's grain "
                                "(-0.047 to -0.056), a fifth of what a made-to-hack run loses in two iterations "
                                "(-0.45)")),
    RewardInfo("brightness", "Mean pixel value, in [0, 1]: a reward made to be gamed (a policy raises it by washing "
               "images out), to watch the hacking rule catch a run (docs/rewards.md); never a "
               "goal", _brightness, best=1.0,
               floor=Floor(0.03, "a mean shift of 8 of 255 levels, which on the tiny world's exact paint costs "
                                 "tinyworld_fidelity 0.22 (four times a 4-level noise's 0.10: plainly visible)")),
    RewardInfo("imagereward", "ImageReward-v1.0 (BLIP ViT-L + BERT cross-attention + MLP head)", _imagereward,
               weights="hub THUDM/ImageReward (ImageReward.pt, med_config.json) + tokenizer bert-base-uncased",
               extra="rewards",
               backend=IMAGE_REWARD, hub_files=(("THUDM/ImageReward", ("ImageReward.pt",)),
                                                ("THUDM/ImageReward", ("med_config.json",)),
                                                ("bert-base-uncased", ("vocab.txt",))),
               local_files=("ImageReward.pt", "med_config.json"),
               hub_unless_local=(("bert-base-uncased", "tokenizer"),),
               download_gb=1.8, memory_gib=1.7, floor=_paper(1.7636 - 0.455, "base without CFG 0.455 -> 1.7636")),
    RewardInfo("pickscore", "PickScore_v1: logit_scale * cos(text, image) / 26", _pickscore,
               weights="hub yuvalkirstain/PickScore_v1 + processor laion/CLIP-ViT-H-14-laion2B-s32B-b79K", backend=CLIP,
               hub_files=(("yuvalkirstain/PickScore_v1", ("config.json",)), ("yuvalkirstain/PickScore_v1", _WEIGHTS),
                          ("laion/CLIP-ViT-H-14-laion2B-s32B-b79K", ("preprocessor_config.json",)),
                          ("laion/CLIP-ViT-H-14-laion2B-s32B-b79K", _TOKENIZER)),
               local_files=("config.json",), download_gb=4.0, memory_gib=3.7, floor=_paper(0.8932 - 0.8096, "0.8096 -> "
                                                                                                            "0.8932")),
    RewardInfo("clipscore", "CLIP ViT-L/14: logit_scale * cos(text, image) / 100", _clipscore, weights=f"hub {_CLIP_L}",
               backend=CLIP,
               hub_files=((_CLIP_L, ("config.json",)), (_CLIP_L, _WEIGHTS), (_CLIP_L, ("preprocessor_config.json",)),
                          (_CLIP_L, _TOKENIZER)),
               local_files=("config.json",), download_gb=1.7, memory_gib=1.6, floor=_paper(0.3089 - 0.2630, "0.2630 -> "
                                                                                                            "0.3089")),
    RewardInfo("temporal_consistency", "Video: mean cosine similarity of consecutive frames' CLIP ViT-L/14 image "
               "features, in [-1, 1]; weigh it against an image reward (alone, a still clip maximises it)", _temporal,
               weights=f"hub {_CLIP_L}", media="video", backend=CLIP,
               hub_files=((_CLIP_L, ("config.json",)), (_CLIP_L, _WEIGHTS), (_CLIP_L, ("preprocessor_config.json",)),
                          (_CLIP_L, _TOKENIZER)),
               local_files=("config.json",), download_gb=1.7, memory_gib=1.6, best=1.0,
               floor=Floor(0.5, "no published figure: half its standard deviation over the base evaluation's clips",
                           of_spread=True)),
    RewardInfo("hpsv2", "HPS v2.1 through open_clip ViT-H-14: image . text features", _hpsv2,
               weights="hub xswu/HPSv2 (HPS_v2.1_compressed.pt)", extra="rewards", backend=OPEN_CLIP,
               hub_files=(("xswu/HPSv2", ("HPS_v2.1_compressed.pt",)),), local_files=("HPS_v2.1_compressed.pt",),
               download_gb=2.0, memory_gib=3.7, floor=_paper(0.3688 - 0.2566, "0.2566 -> 0.3688")),
)
BUILTIN: dict[str, RewardInfo] = {r.name: r for r in BUILTINS}


def backends() -> dict[Backend, list[str]]:
    """Each backend of the built-ins, with the rewards that score with it (in BUILTINS' order)."""
    out: dict[Backend, list[str]] = {}
    for info in BUILTINS:
        if info.backend is not None:
            out.setdefault(info.backend, []).append(info.name)
    return out


def torchvision_rewards() -> list[str]:
    """The built-ins whose backend imports torchvision."""
    return [info.name for info in BUILTINS if info.backend is not None and info.backend.torchvision]


# --- plugins ----------------------------------------------------------------------------------------

def is_plugin_ref(name: str) -> bool:
    """Whether a reward name points at code: 'module:attr' or 'path/file.py:attr' (a URL reward,
    remote:URL or vlm:URL, also holds ':' and is not one: reward_endpoints.py)."""
    from solrl_core.rewards.endpoints import is_endpoint

    return ":" in name and not is_endpoint(name)


def split_ref(name: str) -> tuple[str, str]:
    """'mypkg.rewards:ocr' -> ('mypkg.rewards', 'ocr'); 'path/to/file.py:score' -> ('path/to/file.py',
    'score'). The attribute is after the last ':' and is a Python name; a file ends in .py."""
    target, _, attr = name.rpartition(":")
    example = "write it like mypkg.rewards:ocr or path/to/file.py:score, with a weight after '=': mypkg.rewards:ocr=0.5"
    if _NUMBER.fullmatch(attr) and target:
        raise SolrlError(f"reward '{name}': a weight follows '=', not ':'", f"write {target}={attr.strip()}")
    if not re.fullmatch(_IDENT, attr):
        raise SolrlError(f"reward plugin '{name}': '{attr}' after the last ':' is not a Python name", example)
    if target.endswith(".py"):
        return target, attr
    if not _MODULE.fullmatch(target):
        raise SolrlError(f"reward plugin '{name}': '{target}' is neither a module path (a.b.c) nor a .py file", example)
    return target, attr


def check_ref(name: str) -> None:
    """What can be known of a plugin reference without importing it: its form, and that a file exists."""
    target, _ = split_ref(name)
    if target.endswith(".py") and not Path(target).expanduser().is_file():
        raise SolrlError(f"reward plugin '{name}': the file {target} does not exist",
                         "give a path to a .py file, relative to the folder you run solrl in, or absolute")


def entry_points() -> dict[str, metadata.EntryPoint]:
    """The rewards installed packages declare in the `solrl.rewards` entry-point group, by name
    (the first one found wins when two packages declare the same name). Read from the packages'
    metadata: nothing is imported."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def _dist(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an installed package"


def _from_entry_point(ep: metadata.EntryPoint) -> RewardInfo:
    origin = f"entry point {ep.value} of {_dist(ep)}"
    return RewardInfo(ep.name, f"plugin: {ep.value} (installed package {_dist(ep)})", plugin=ep.value, origin=origin,
                      floor=PLUGIN_FLOOR)


def registry() -> dict[str, RewardInfo]:
    """Every reward a name can select: the built-ins, then the installed plugins (a plugin named
    like a built-in is shadowed by it)."""
    out = dict(BUILTIN)
    for name, ep in entry_points().items():
        out.setdefault(name, _from_entry_point(ep))
    return out


def lookup(name: str) -> RewardInfo | None:
    """The reward `name` selects: a built-in, an installed plugin, or a plugin reference; None when
    the name selects nothing (URL rewards are not here: reward_endpoints.py)."""
    if name in BUILTIN:
        return BUILTIN[name]
    if is_plugin_ref(name):
        split_ref(name)
        return RewardInfo(name, f"plugin: {name}", plugin=name, origin=f"plugin {name}", floor=PLUGIN_FLOOR)
    ep = entry_points().get(name)
    return _from_entry_point(ep) if ep is not None else None
