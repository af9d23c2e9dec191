"""A small OpenAI-compatible chat-completions server whose "VLM" reads tiny-world images exactly.

It follows the API's schema (GET /v1/models, POST /v1/chat/completions with image_url content parts,
logprobs/top_logprobs, usage), and tests/test_reward_server.py validates its answers with the
official `openai` client library and its response types. Its judgement is the tiny world's
GenEval-style score s of the image against the quoted prompt: asked with logprobs it answers "yes"
with log-probability log(s) and "no" with log(1 - s), so a VQAScore-style judge reads back P(yes) = s;
asked without, it answers round(10 * s) as text. Several images in one message (a clip's frames) are
judged each, and s is their mean.

    python -m tests.vlm_server --port 8001 [--model NAME] [--api-key KEY] [--delay-s SECONDS]
"""

import argparse
import base64
import io
import math
import re
import time
import uuid

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from PIL import Image

from solrl_core.data.tinyworld import parse
from solrl_core.rewards.tinyworld import analyze, score

FLOOR = -100.0  # log-probability written for probability 0 (JSON has no -inf)


def judge(data_url: str, question: str) -> float:
    prefix = "data:image/png;base64,"
    if not data_url.startswith(prefix):
        raise ValueError("image_url must be a PNG data URL")
    image = np.asarray(Image.open(io.BytesIO(base64.b64decode(data_url[len(prefix):]))).convert("RGB"))
    quoted = re.search(r'"([^"]*)"', question)
    spec = parse(quoted.group(1)) if quoted else None
    if spec is None:
        raise ValueError(f"no tiny-world caption in quotes in {question!r}")
    return score(spec, analyze(image))


def _logprob(p: float) -> float:
    return math.log(p) if p > 0 else FLOOR


def _token(text: str, p: float) -> dict:
    return {"token": text, "logprob": _logprob(p), "bytes": list(text.encode())}


def completion(model: str, body: dict) -> dict:
    (message,) = [m for m in body["messages"] if m["role"] == "user"][-1:]
    parts = message["content"]
    images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    text = next(p["text"] for p in parts if p["type"] == "text")
    s = sum(judge(image, text) for image in images) / len(images)
    logprobs = None
    if body.get("logprobs"):
        answer = "yes" if s >= 0.5 else "no"
        top = sorted([_token("yes", s), _token("no", 1 - s)],
                     key=lambda t: -t["logprob"])[:max(1, body.get("top_logprobs") or 1)]
        logprobs = {"content": [{**_token(answer, s if answer == "yes" else 1 - s), "top_logprobs": top}],
                    "refusal": None}
    else:
        answer = str(round(10 * s))
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer, "refusal": None},
                         "logprobs": logprobs, "finish_reason": "length" if body.get("max_tokens") == 1 else "stop"}],
            "usage": {"prompt_tokens": 64, "completion_tokens": 1, "total_tokens": 65}}


def build(model: str, api_key: str, delay_s: float) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                           "param": None, "code": "invalid_api_key"}}, status_code=401)
        return await call_next(request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "solrl-tests"}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        if body.get("model") != model:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                           "type": "NotFoundError",
                                           "param": None, "code": 404}}, status_code=404)
        time.sleep(delay_s)
        try:
            return completion(model, body)
        except (ValueError, KeyError, StopIteration) as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError", "param": None, "code": 400}},
                                status_code=400)

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="tiny-judge")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--delay-s", type=float, default=0.0)
    args = parser.parse_args()
    uvicorn.run(build(args.model, args.api_key, args.delay_s), host="127.0.0.1", port=args.port, log_level="warning")
