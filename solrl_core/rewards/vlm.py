"""`vlm:URL`: a vision-language model as the judge, through any OpenAI-compatible chat-completions
endpoint (vLLM, SGLang, a hosted API). URL is the API's base, the one ending in /v1.

Each image is sent as a PNG data URL with the judge's question about its prompt (reward.remote:
judge, template, model, scoring; presets in reward_endpoints.JUDGES). A video model's clip is sent as
its frames (the ones reward.video_frames samples), in order, as PNG data URLs in one message, then
the question about the video (reward.remote.video_template), and judged once per clip. Two ways to
read the answer:
  yes_prob  P(yes) of the first answer token, summed over the spellings of "yes" among the returned
            top log-probabilities (temperature 0, one token): VQAScore's score, a dense value in [0, 1]
            where a parsed yes/no would be binary. A "yes" below the top 20 counts as 0.
  number    the first number of the reply, divided by the judge's scale ("Rate it from 0 to 10").

Built once at the start of a run: GET URL/models must answer and list the model (when no model is
set, the endpoint must serve exactly one, which is used). Requests run `concurrency` at a time,
each limited to the reward's time limit and retried on connection errors (transport.py). An answer
without log-probabilities, or without a number, is an error naming the reply: never a silent 0.
"""

from __future__ import annotations

import base64
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards.endpoints import API_KEY_ENV, judge_for, split_name
from solrl_core.rewards.transport import call
from solrl_core.rewards.wire import png_bytes

DEFAULT_TIMEOUT_S = 600.0
TOP_LOGPROBS = 20  # the most the OpenAI API (and vLLM's default max_logprobs) returns
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class VlmJudge:
    """One score per image from a VLM's answer to the judge's question about its prompt."""

    def __init__(self, name: str, settings: dict[str, str], timeout_s: float = 0.0, video_frames: int = 0) -> None:
        _, self.url = split_name(name)
        self.video_frames = video_frames  # a clip's frames sent (rewards/video.py's sampling; 0: every frame)
        self.name = name
        self.judge = judge_for(settings)
        self.concurrency = int(settings.get("concurrency", 8))
        self.max_tokens = int(settings.get("max_tokens", 8))
        self.timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        self.api_key = os.environ.get(API_KEY_ENV, "")
        served, self.latency_s = self.models()
        self.model = self.judge.model or (served[0] if len(served) == 1 else "")
        if not self.model:
            raise SolrlError(f"VLM endpoint {self.url} serves {len(served)} models ({', '.join(served[:5])})",
                             "name one with --set reward.remote.model=NAME")
        if self.model not in served:
            raise SolrlError(f"VLM endpoint {self.url} does not serve model '{self.model}' (it serves "
                             f"{', '.join(served[:5])})",
                             "set reward.remote.model to one of those, or serve that model there")

    def models(self) -> tuple[list[str], float]:
        """The model ids the endpoint lists (GET URL/models), and how long it took."""
        answer, seconds = call(f"{self.url}/models", None, timeout_s=min(self.timeout_s, 30.0), token=self.api_key,
                               what=f"VLM endpoint {self.url}")
        data = answer.get("data") if isinstance(answer, dict) else None
        ids = [m.get("id") for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if not ids:
            raise SolrlError(f"{self.url}/models lists no model ({str(answer)[:120]})",
                             "point vlm: at an OpenAI-compatible API base URL, the one ending in /v1")
        return ids, seconds

    media = ("image", "video")  # a clip is judged whole, from its frames

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """[B] float32 CPU scores for [B, 3, H, W] images, or [B, F, 3, H, W] clips, in [0, 1]."""
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        frames = images.detach().cpu()
        if frames.dim() == 5:
            from solrl_core.rewards.video import frame_indices

            frames = frames[:, frame_indices(frames.shape[1], self.video_frames)]
        pngs = [[png_bytes(f) for f in clip] if frames.dim() == 5 else png_bytes(clip) for clip in frames]
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="solrl-vlm") as pool:
            scores = list(pool.map(self.ask, pngs, prompts))
        return torch.tensor(scores, dtype=torch.float32)

    def request(self, png: bytes | list[bytes], prompt: str) -> dict[str, Any]:
        """The chat-completions body asking about one image, or about one clip (a list of its frames' PNGs)."""
        video = isinstance(png, list)
        question = self.judge.question(prompt, video)
        images = [{"type": "image_url",
                   "image_url": {"url": "data:image/png;base64," + base64.b64encode(b).decode("ascii")}}
                  for b in (png if video else [png])]
        body: dict[str, Any] = {"model": self.model, "temperature": 0.0,
                                "messages": [{"role": "user",
                                              "content": [*images, {"type": "text", "text": question}]}]}
        if self.judge.scoring == "yes_prob":
            body.update(max_tokens=1, logprobs=True, top_logprobs=TOP_LOGPROBS)
        else:
            body.update(max_tokens=self.max_tokens)
        return body

    def ask(self, png: bytes | list[bytes], prompt: str) -> float:
        answer, _ = call(f"{self.url}/chat/completions", self.request(png, prompt), timeout_s=self.timeout_s,
                         token=self.api_key, what=f"VLM endpoint {self.url}")
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise SolrlError(f"VLM endpoint {self.url} answered without choices ({str(answer)[:120]})",
                             "check that it is an OpenAI-compatible chat-completions API")
        if self.judge.scoring == "yes_prob":
            return yes_probability(choices[0], self.url)
        return number_score(choices[0], self.judge.scale, self.url)


def yes_probability(choice: dict[str, Any], url: str) -> float:
    """P('yes') of a choice's first token from its log-probabilities ('Yes', ' yes', ... summed)."""
    content = (choice.get("logprobs") or {}).get("content") or []
    if not content or not isinstance(content[0], dict):
        raise SolrlError(f"VLM endpoint {url} returned no log-probabilities", "serve with log-probabilities enabled "
                         "(vLLM and SGLang return them on request), or judge with --set reward.remote.scoring=number "
                         "and a template asking for a number")
    first = content[0]
    tokens = {t.get("token"): t.get("logprob") for t in [*(first.get("top_logprobs") or []), first]
              if isinstance(t, dict)}
    return float(sum(math.exp(lp) for tok, lp in tokens.items()
                     if isinstance(tok, str) and tok.strip().lower() == "yes" and isinstance(lp, (int, float))))


def number_score(choice: dict[str, Any], scale: float, url: str) -> float:
    """The first number of a choice's reply, divided by `scale`."""
    text = (choice.get("message") or {}).get("content") or ""
    found = _NUMBER.search(text) if isinstance(text, str) else None
    if found is None:
        raise SolrlError(f"VLM endpoint {url} answered {str(text)[:80]!r}, which holds no number",
                         "use a template that asks for the number only (reward.remote.template), or a larger "
                         "reward.remote.max_tokens")
    return float(found.group()) / scale
