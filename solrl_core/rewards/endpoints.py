"""Rewards that live behind a URL, by name: `remote:URL` (a `solrl reward-server`) and `vlm:URL` (any
OpenAI-compatible chat-completions endpoint judging the image), and the `reward.remote` settings
they read. Torch-free, like rewards/names.py, so a config naming them can be checked without torch.

What an endpoint judges (`media`: images, a video model's clips, or both) is known once it answers:
a reward server states it in /health (from the rewards it serves), a VLM judge takes both (a clip as
its frames, in order, in one request). `check_media` refuses the mismatch in one line.

A name is the prefix and the URL: `remote:http://gpu-box:8000`, `vlm:http://127.0.0.1:8001/v1`. In a
weight list the weight follows the URL after its last '=': `remote:http://h:8000=0.5,pickscore=1`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from solrl_core.errors import SolrlError, close_matches

PREFIXES = ("remote:", "vlm:")
TOKEN_ENV = "SOLRL_REWARD_TOKEN"  # the reward server's token: read by the server and sent by remote: rewards
API_KEY_ENV = "OPENAI_API_KEY"  # sent by vlm: rewards as a bearer token when set (vLLM's --api-key)
ENCODINGS = ("uint8", "png", "float32")


@dataclass(frozen=True)
class Judge:
    """A VLM judge preset: what to ask about each image and how to read the answer.

    scoring 'yes_prob': P(first token is 'yes') from the returned log-probabilities (VQAScore-style);
    'number': the first number in the reply divided by `scale`."""

    template: str
    scoring: str = "yes_prob"
    scale: float = 1.0
    model: str = ""  # '' = the one model the endpoint serves (GET /v1/models)
    video_template: str = ""  # the question asked of a clip's frames; '' = the template with 'image' read as 'video'

    def question(self, prompt: str, video: bool) -> str:
        template = (self.video_template or VIDEO_PREAMBLE
                    + self.template.replace("image", "video")) if video else self.template
        return template.replace("{prompt}", prompt)


VIDEO_PREAMBLE = "The images are frames of one video, in order. "


JUDGES: dict[str, Judge] = {
    "yes_no": Judge('Does this image show "{prompt}"? Answer yes or no.'),
    "score_0_10": Judge('How well does this image match the description "{prompt}"? Rate it from 0 (not at all) to 10 '
                        "(perfectly). Answer with the number only.", scoring="number", scale=10.0),
    "qwen25vl_yes_no": Judge('Does this image show "{prompt}"? Answer yes or no.', model="Qwen/Qwen2.5-VL-7B-Instruct"),
}
SCORINGS = ("yes_prob", "number")
# reward.remote keys: encoding is read by remote: rewards, the rest by vlm: rewards.
SETTINGS = {
    "encoding": "image wire format of remote: rewards: uint8 (default), png or float32",
    "judge": f"VLM judge preset: {', '.join(JUDGES)} (default yes_no)",
    "model": "model name sent to the VLM endpoint (default: the judge's, else the one the endpoint serves)",
    "template": "question asked per image; {prompt} is replaced by the prompt (default: the judge's)",
    "video_template": "question asked per clip, sent after its frames; {prompt} is replaced (default: the template, "
                      f"'image' read as 'video', after: {VIDEO_PREAMBLE.strip()})",
    "scoring": "yes_prob (P(yes) from log-probabilities) or number (first number in the reply / scale)",
    "scale": "divisor of a 'number' judge's answer (default: the judge's)",
    "concurrency": "requests in flight at once to the VLM endpoint (default 8)",
    "max_tokens": "tokens a 'number' judge may answer with (default 8; yes_prob asks for 1)",
    "on_change": "on --resume, a remote: server serving something else than the run recorded: refuse (default) or warn",
}


def is_endpoint(name: str) -> bool:
    return name.startswith(PREFIXES)


def split_name(name: str) -> tuple[str, str]:
    """'remote:http://h:8000/' -> ('remote', 'http://h:8000'): the kind and the URL, checked."""
    kind, _, url = name.partition(":")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SolrlError(f"reward '{name}' does not name an http(s) URL", f"write it like {kind}:http://127.0.0.1:8000")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise SolrlError(f"reward '{name}' has a bad port ({exc})",
                         f"write it like {kind}:http://127.0.0.1:8000") from exc
    if parts.query or parts.fragment or "," in url or "=" in url:
        raise SolrlError(f"reward '{name}': the URL may not hold a query, a fragment, ',' or '='",
                         "give the server's base URL; settings go in reward.remote (docs/rewards.md)")
    return kind, url.rstrip("/")


def split_weight(part: str) -> tuple[str, str]:
    """One entry of a weight list that names an endpoint: (name, weight text, '' when none)."""
    name, sep, value = part.rpartition("=")
    if sep and re.fullmatch(r"\s*[-+0-9.eE]+\s*", value) and is_endpoint(name.strip()):
        return name.strip(), value
    return part.strip(), ""


def label(name: str) -> str:
    """A short, path-safe form of a reward name, for preset and folder names."""
    if not is_endpoint(name):
        return name
    kind, _, url = name.partition(":")
    parts = urlsplit(url)
    return f"{kind}-{parts.hostname}-{parts.port or parts.scheme}"


def check_settings(settings: dict[str, str]) -> None:
    """reward.remote: known keys and values of the right kind."""
    for key, value in settings.items():
        if key not in SETTINGS:
            raise SolrlError(f"unknown setting reward.remote.{key}", close_matches(key, list(SETTINGS)))
        if key == "encoding" and value not in ENCODINGS:
            raise SolrlError(f"reward.remote.encoding = {value!r}", f"choose one of: {', '.join(ENCODINGS)}")
        if key == "judge" and value not in JUDGES:
            raise SolrlError(f"unknown VLM judge '{value}' (reward.remote.judge)", close_matches(value, list(JUDGES)))
        if key == "on_change" and value not in ("refuse", "warn"):
            raise SolrlError(f"reward.remote.on_change = {value!r}", "choose one of: refuse, warn")
        if key == "scoring" and value not in SCORINGS:
            raise SolrlError(f"reward.remote.scoring = {value!r}", f"choose one of: {', '.join(SCORINGS)}")
        if key in ("template", "video_template") and "{prompt}" not in value:
            raise SolrlError("reward.remote.template has no {prompt}", 'write it like: Does this image show '
                                                                       '"{prompt}"? Answer yes or no.')
        if key in ("concurrency", "max_tokens", "scale"):
            try:
                number = float(value)
            except ValueError:
                number = 0.0
            if number <= 0 or (key != "scale" and not number.is_integer()):
                raise SolrlError(f"reward.remote.{key} = {value!r} is not a positive "
                                 f"{'number' if key == 'scale' else 'integer'}",
                                 f"for example --set reward.remote.{key}={'10' if key == 'scale' else '8'}")


def judge_for(settings: dict[str, str]) -> Judge:
    """The VLM judge reward.remote describes: its preset with any key set there taking precedence."""
    base = JUDGES[settings.get("judge", "yes_no")]
    return Judge(template=settings.get("template", base.template), scoring=settings.get("scoring", base.scoring),
                 scale=float(settings.get("scale", base.scale)), model=settings.get("model", base.model),
                 video_template=settings.get("video_template", base.video_template))


def check_media(name: str, media: tuple[str, ...], video: bool) -> None:
    """Refuse, in one line, an endpoint that cannot judge what the model makes (`media`: what it said it
    judges, "image" and/or "video")."""
    if video and "video" not in media:
        raise SolrlError(f"reward '{name}' judges only still images and this model makes videos",
                         "serve rewards that score a clip's frames there (e.g. solrl reward-server --reward "
                         "imagereward), or drop it from --reward")
    if not video and "image" not in media:
        raise SolrlError(f"reward '{name}' judges only videos and this model makes images",
                         "drop it from --reward, or serve an image reward there")
