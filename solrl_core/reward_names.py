"""The rewards solrl knows, by name, and how a `--reward` weight list is read: torch-free, so a
config can be resolved and checked (and a typo reported) without loading torch. The builders that
load each reward live in rewards/__init__.py, keyed by these names."""

from __future__ import annotations

from dataclasses import dataclass

from solrl_core.errors import SolrlError, close_matches
from solrl_core.reward_endpoints import is_endpoint, split_name, split_weight


@dataclass(frozen=True)
class RewardInfo:
    name: str
    description: str
    weights: str = ""  # where the weights come from, for errors and `doctor`; '' = needs none
    extra: str = ""  # the pip extra that installs its backend; '' = core install
    best: float | None = None  # the highest score it can give, when bounded: every image there is saturation, not a fault


REWARDS: tuple[RewardInfo, ...] = (
    RewardInfo("jpeg_compressibility", "Smaller JPEG files score higher: -size_KB / 500 (PIL, quality 95)"),
    RewardInfo("jpeg_incompressibility", "Larger JPEG files score higher: +size_KB (PIL, quality 95)"),
    RewardInfo("tinyworld_geneval", "GenEval-style partial score of a tiny-world image against its caption, in [0, 1]", best=1.0),
    RewardInfo("imagereward", "ImageReward-v1.0 (BLIP ViT-L + BERT cross-attention + MLP head)",
               weights="hub THUDM/ImageReward (ImageReward.pt, med_config.json) + tokenizer bert-base-uncased",
               extra="rewards"),
    RewardInfo("pickscore", "PickScore_v1: logit_scale * cos(text, image) / 26",
               weights="hub yuvalkirstain/PickScore_v1 + processor laion/CLIP-ViT-H-14-laion2B-s32B-b79K"),
    RewardInfo("clipscore", "CLIP ViT-L/14: logit_scale * cos(text, image) / 100",
               weights="hub openai/clip-vit-large-patch14"),
    RewardInfo("hpsv2", "HPS v2.1 through open_clip ViT-H-14: image . text features",
               weights="hub xswu/HPSv2 (HPS_v2.1_compressed.pt)", extra="rewards"),
)


def known_names() -> list[str]:
    """Every reward name a config may weight (including any registered at run time in rewards.SPECS)."""
    import sys

    rewards = sys.modules.get("solrl_core.rewards")  # loaded already: its registry may hold more
    return list(rewards.SPECS) if rewards is not None else [r.name for r in REWARDS]


def check_names(weights: dict[str, float], paths: dict[str, str]) -> None:
    """Every weighted reward is known, and every weights path belongs to one of them."""
    names = known_names()
    unknown = [n for n in weights if n not in names and not is_endpoint(n)]
    for name in filter(is_endpoint, weights):
        split_name(name)  # remote:URL and vlm:URL (reward_endpoints.py): the URL must be usable
    if unknown:
        raise SolrlError(f"unknown reward '{unknown[0]}'", close_matches(unknown[0], names) + " (list them with: solrl presets)")
    stray = [n for n in paths if n not in weights or is_endpoint(n)]
    if stray:
        raise SolrlError(f"reward.paths names '{stray[0]}', which is not among the run's rewards ({', '.join(weights)})",
                         "remove it, or add the reward with --reward")


def is_weight_list(text: str) -> bool:
    """Whether --reward TEXT names rewards with weights (or a remote one) rather than a reward preset."""
    return "=" in text or "," in text or is_endpoint(text)


def parse_weights(spec: str) -> dict[str, float]:
    """'imagereward=1.0,pickscore=0.5' (or a bare 'name', weight 1) -> {name: weight}."""
    weights: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if is_endpoint(part):
            name, value = split_weight(part)  # the URL may hold ':' and '/': the weight is a trailing =NUMBER
        else:
            name, _, value = part.partition("=")
        name = name.strip()
        try:
            weight = float(value) if value.strip() else 1.0
        except ValueError as exc:
            raise SolrlError(f"reward weight '{value}' for '{name}' is not a number", "write it like imagereward=1.0,pickscore=0.5") from exc
        if name in weights:
            raise SolrlError(f"reward '{name}' is named twice in '{spec}'", "name each reward once")
        weights[name] = weight
    if not weights:
        raise SolrlError("no reward named", "write it like imagereward=1.0,pickscore=0.5")
    return weights
