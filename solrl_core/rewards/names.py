"""How `--reward` and `reward.weights` name rewards, torch-free, so a config can be resolved and
checked (and a typo reported) without loading torch. The rewards themselves are declared in
registry.py.

A weight list is entries joined by ',': `NAME` (weight 1) or `NAME=WEIGHT`. The weight always
follows the LAST '=' of an entry; ':' never introduces a weight, it only separates a plugin's
module or file from its attribute (`mypkg.rewards:ocr=0.5`, `path/to/file.py:score=2`) and a URL
reward's kind from its URL (`remote:http://h:8000=0.5`). So a plugin's file path may not hold ','
or '='.
"""

from __future__ import annotations

from pathlib import PurePath

from solrl_core.errors import SolrlError, close_matches
from solrl_core.rewards.endpoints import is_endpoint, split_name, split_weight
from solrl_core.rewards.endpoints import label as endpoint_label
from solrl_core.rewards.registry import check_ref, is_plugin_ref, lookup, registry, split_ref


def known_names() -> list[str]:
    """Every reward name a config may weight without a ':' (built-ins and installed plugins)."""
    return list(registry())


def check_names(weights: dict[str, float], paths: dict[str, str]) -> None:
    """Every weighted reward is known, and every weights path belongs to one of them."""
    for name in weights:
        if is_endpoint(name):
            split_name(name)  # remote:URL and vlm:URL (reward_endpoints.py): the URL must be usable
        elif is_plugin_ref(name):
            check_ref(name)  # its form and its file; importing it is for the RewardSet (rewards/plugins.py)
    names = known_names()
    unknown = [n for n in weights if n not in names and not is_endpoint(n) and not is_plugin_ref(n)]
    if unknown:
        raise SolrlError(f"unknown reward '{unknown[0]}'", close_matches(unknown[0], names) + " (list them with: solrl "
                                                                                              "presets)")
    stray = [n for n in paths if n not in weights or is_endpoint(n)]
    if stray:
        raise SolrlError(f"reward.paths names '{stray[0]}', which is not among the run's rewards "
                         f"({', '.join(weights)})",
                         "remove it, or add the reward with --reward")


FRAME_REDUCTIONS = ("mean", "min")  # how an image reward's frame scores make a clip's score (rewards/video.py)


def check_media(names: list[str], video: bool, knob: str = "--reward") -> None:
    """Each reward can judge what the model makes (registry.py's `media` and `on_frames`): a video
    reward refuses an image model, a reward of still images only refuses a video model. A URL
    reward or a plugin is taken to judge images (on a video run: sampled frames)."""
    for name in names:
        info = None if is_endpoint(name) else lookup(name)
        if info is None:
            continue
        if info.media == "video" and not video:
            raise SolrlError(f"reward '{name}' judges videos and this model makes images",
                             f"drop {name} from {knob}, or train a video model (e.g. --model wan21_t2v_1_3b)")
        if info.media == "image" and video and not info.on_frames:
            raise SolrlError(f"reward '{name}' judges only the tiny world's still images and this model makes videos",
                             f"drop {name} from {knob}, or use a reward scored on frames (e.g. --reward imagereward)")


def judged_media(names: list[str]) -> list[str]:
    """What rewards `names` together can judge, as a reward server states it: "image" unless one judges
    only clips, "video" unless one judges only still images (an image reward scored on frames judges both)."""
    infos = [lookup(n) for n in names]
    media = ["image"] if all(i is None or i.media == "image" for i in infos) else []
    return media + (["video"] if all(i is None or i.media == "video" or i.on_frames for i in infos) else [])


def is_weight_list(text: str) -> bool:
    """Whether --reward TEXT names rewards with weights, a URL reward or a plugin by its code, rather
    than one reward by name."""
    return "=" in text or "," in text or ":" in text


def parse_weights(spec: str) -> dict[str, float]:
    """'imagereward=1.0,pickscore=0.5' (or a bare 'name', weight 1) -> {name: weight}."""
    weights: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if is_endpoint(part):
            name, value = split_weight(part)  # the URL may hold ':' and '/': the weight is a trailing =NUMBER
        else:
            name, _, value = part.rpartition("=") if "=" in part else (part, "", "")
        name = name.strip()
        if is_plugin_ref(name):
            split_ref(name)  # 'mod:attr:0.5' is told to write its weight after '='
        try:
            weight = float(value) if value.strip() else 1.0
        except ValueError as exc:
            raise SolrlError(f"reward weight '{value}' for '{name}' is not a number",
                             "write it like imagereward=1.0,pickscore=0.5") from exc
        if name in weights:
            raise SolrlError(f"reward '{name}' is named twice in '{spec}'", "name each reward once")
        weights[name] = weight
    if not weights:
        raise SolrlError("no reward named", "write it like imagereward=1.0,pickscore=0.5")
    return weights


def label(name: str) -> str:
    """A short, path-safe form of a reward name, for preset and folder names: a plugin's file or
    module and its attribute ('score.py:score' -> 'score-score'), a URL reward's host and port."""
    if is_endpoint(name):
        return endpoint_label(name)
    if is_plugin_ref(name):
        target, attr = split_ref(name)
        return f"{PurePath(target).stem if target.endswith('.py') else target}-{attr}"
    return name
