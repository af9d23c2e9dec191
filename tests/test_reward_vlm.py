"""`--reward vlm:URL`: a VLM judge over an OpenAI-compatible API, against a real server process
(tests/vlm_server.py) whose answers are first checked with the official `openai` client library."""

import base64
import json

import pytest
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.rewards import RewardSet
from solrl_core.rewards.health import RewardHealth
from solrl_core.rewards.tinyworld import TinyWorldReward
from solrl_core.rewards.vlm import VlmJudge
from solrl_core.rewards.wire import png_bytes
from tests.serving import request, serve
from tests.helpers import noisy_world

openai = pytest.importorskip("openai")
MODEL = "tiny-judge"


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    with serve(["-m", "tests.vlm_server", "--model", MODEL], "/v1/models", tmp_path_factory.mktemp("vlm")) as served:
        yield served


@pytest.fixture(scope="module")
def guarded_slow_vlm(tmp_path_factory):
    with serve(["-m", "tests.vlm_server", "--model", MODEL, "--api-key", "k3y", "--delay-s", "1.5"], "/v1/models",
               tmp_path_factory.mktemp("vlm-guarded"), headers={"Authorization": "Bearer k3y"}) as served:
        yield served


def _ask(prompt, image, **extra):
    url = "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()
    return {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                                      {"type": "text", "text": f'Does this image show '
                                                                                               f'"{prompt}"?'}]}],
            **extra}


def test_the_stand_in_server_speaks_the_openai_schema(vlm):
    from openai.types import Model
    from openai.types.chat import ChatCompletion

    client = openai.OpenAI(base_url=vlm.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    prompts, images = noisy_world(2)
    reply = client.chat.completions.create(**_ask(prompts[0], images[0], max_tokens=1, logprobs=True, top_logprobs=5))
    first = reply.choices[0].logprobs.content[0]
    assert {t.token for t in first.top_logprobs} == {"yes", "no"} and first.token == reply.choices[0].message.content
    # The raw answers validated by the library's own pydantic types (the client builds its objects without validating).
    status, raw = request(vlm.url + "/v1/chat/completions",
                          json.dumps(_ask(prompts[1], images[1], max_tokens=4)).encode())
    assert status == 200
    validated = ChatCompletion.model_validate(raw)
    assert validated.choices[0].message.content.isdigit() and validated.choices[0].logprobs is None
    Model.model_validate(request(vlm.url + "/v1/models")[1]["data"][0])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(**{**_ask(prompts[0], images[0]), "model": "other"})


def test_a_yes_no_judge_scores_p_yes_from_the_log_probabilities(vlm):
    prompts, images = noisy_world(16)
    truth = TinyWorldReward()(images, prompts)
    judge = VlmJudge(f"vlm:{vlm.url}/v1", {"concurrency": "4"}, timeout_s=30)
    assert judge.model == MODEL  # the one model the endpoint serves
    scores = judge(images, prompts)
    assert len(set(truth.tolist())) > 2
    assert torch.allclose(scores, truth, atol=1e-6, rtol=0), (scores, truth)
    body = judge.request(png_bytes(images[0]), prompts[0])
    assert (body["max_tokens"], body["logprobs"], body["top_logprobs"]) == (1, True, 20)
    assert body["messages"][0]["content"][1]["text"] == f'Does this image show "{prompts[0]}"? Answer yes or no.'


def test_a_number_judge_reads_the_reply_and_divides_by_its_scale(vlm):
    prompts, images = noisy_world(8)
    truth = TinyWorldReward()(images, prompts)
    judge = VlmJudge(f"vlm:{vlm.url}/v1", {"judge": "score_0_10", "model": MODEL}, timeout_s=30)
    assert torch.equal(judge(images, prompts), torch.round(truth * 10) / 10)


def test_a_vlm_reward_runs_in_a_reward_set_with_the_health_checks(vlm):
    prompts, images = noisy_world(8)
    name = f"vlm:{vlm.url}/v1"
    cfg = resolve_config("tiny", reward=f"{name}=2.0", sets=["reward.remote.concurrency=2", "reward.timeout_s=30"])
    rewards = RewardSet.from_config(cfg.reward, torch.device("cpu"))
    scores = rewards(images, prompts)
    assert torch.allclose(scores.components[name], TinyWorldReward()(images, prompts), atol=1e-6, rtol=0)
    assert torch.equal(scores.total, 2.0 * scores.components[name])
    health = RewardHealth(min_std=1e-6, patience=1)
    assert health.check(scores.components, torch.arange(8) // 4) == []
    flat = {name: torch.full((8,), 0.5)}  # what a judge that stopped looking at the images would give
    assert [f.reward for f in health.check(flat, torch.arange(8) // 4)] == [name] and health.failure() is not None


def test_endpoint_problems_are_named(vlm, guarded_slow_vlm, monkeypatch):
    with pytest.raises(SolrlError, match=f"does not serve model 'Qwen/Qwen2.5-VL-7B-Instruct' \\(it serves {MODEL}\\)"):
        VlmJudge(f"vlm:{vlm.url}/v1", {"judge": "qwen25vl_yes_no"}, timeout_s=30)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(SolrlError, match="HTTP 401: Incorrect API key provided") as refused:
        VlmJudge(f"vlm:{guarded_slow_vlm.url}/v1", {}, timeout_s=30)
    assert "OPENAI_API_KEY" in refused.value.fix
    monkeypatch.setenv("OPENAI_API_KEY", "k3y")
    # listing models is quick; judging takes 1.5 s
    judge = VlmJudge(f"vlm:{guarded_slow_vlm.url}/v1", {}, timeout_s=0.5)
    prompts, images = noisy_world(1)
    with pytest.raises(SolrlError, match="did not answer within 0.5 s"):
        judge(images, prompts)
    with pytest.raises(SolrlError, match="no log-probabilities"):
        from solrl_core.rewards.vlm import yes_probability
        yes_probability({"message": {"content": "yes"}, "logprobs": None}, vlm.url)
