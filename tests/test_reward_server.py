"""`solrl reward-server` and `--reward remote:URL`: a real server process on loopback serves the tiny
world's reward; scores and training through it equal the in-process ones bit for bit; a server
killed mid-run stops the run with a checkpoint; tokens, limits and malformed requests; doctor."""

import base64
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.convert import load_run_config
from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.faults.manifest import verify
from solrl_core.io.images import to_uint8
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.rewards import RewardSet
from solrl_core.rewards.base import RewardContext
from solrl_core.rewards.names import parse_weights
from solrl_core.rewards.remote import RemoteReward
from solrl_core.rewards.server import Batcher
from solrl_core.rewards.tinyworld import TinyWorldReward
from solrl_core.rewards.transport import HttpError
from solrl_core.rewards.watchdog import RewardFailure
from solrl_core.rewards.wire import decode_images, encode_images
from tests.serving import ROOT, request, reward_server
from tests.helpers import noisy_world


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with reward_server(tmp_path_factory.mktemp("server"), "--reward", "tinyworld_geneval", "--batch-size", "8",
                       "--max-images", "64") as served:
        yield served


def _post(url, body, headers=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(url, raw, headers)


# ---------------------------------------------------------------- the wire and the scores


def test_uint8_on_the_wire_quantises_back_to_the_same_pixels():
    values = torch.arange(256, dtype=torch.uint8)
    decoded = values.float() / 255  # what the server builds from a uint8 or PNG image
    assert torch.equal(torch.from_numpy(to_uint8(decoded.view(1, 1, 16, 16).expand(1, 3, 16, 16).contiguous())[0, :, :,
                                                                                                               0]),
                       values.view(16, 16))
    _, images = noisy_world(4)
    for encoding in ("uint8", "png"):
        back = decode_images(encode_images(images, encoding), 64, 10**6)
        assert np.array_equal(to_uint8(back), to_uint8(images)), encoding
    assert torch.equal(decode_images(encode_images(images, "float32"), 64, 10**6), images)


def test_remote_scores_equal_in_process_scores_bit_for_bit(server):
    prompts, images = noisy_world()
    local = TinyWorldReward()(images, prompts)
    assert len(set(local.tolist())) > 2  # the images differ in score: equality below means something
    remote = RemoteReward(f"remote:{server.url}")
    assert remote.served == ["tinyworld_geneval=1.0"]
    for encoding in ("uint8", "png", "float32"):
        remote.encoding = encoding
        assert torch.equal(remote(images, prompts), local), encoding


def test_the_tiny_world_trains_through_a_remote_reward_exactly_as_in_process(server, fast_sets):
    def run(reward, run_dir):
        seen = []
        bus = ev.EventBus()
        bus.subscribe(seen.append)
        cfg = resolve_config("tiny", "sol_rl", reward=reward,
                             sets=fast_sets("run.iterations=3", "run.eval_prompts=", run_dir=run_dir))
        session = train(cfg, bus, stop=StopFlag())
        return session, [e for e in seen if isinstance(e, ev.IterationFinished)]

    name = f"remote:{server.url}"
    local, local_its = run("tinyworld_geneval", "local")
    remote, remote_its = run(name, "remote")
    assert [e.iteration for e in remote_its] == [1, 2, 3]
    for a, b in zip(local_its, remote_its):
        assert (a.final.mean, a.final.std, a.draft.mean, a.draft.std) == (b.final.mean, b.final.std, b.draft.mean,
                                                                          b.draft.std)
        assert a.final.components["tinyworld_geneval"] == b.final.components[name]
        assert a.loss == b.loss
    for which in ("default", "old", "ema"):
        x, y = local.run.engine.policy.state(which), remote.run.engine.policy.state(which)
        assert all(torch.equal(x[k], y[k]) for k in x), which
    saved = load_run_config(remote.run.run_dir)  # the URL survives the saved config (resume, eval read it back)
    assert saved.reward.weights == {name: 1.0}
    assert "remote-127.0.0.1-" in saved.preset and "/" not in saved.preset


def test_a_server_killed_mid_run_stops_the_run_with_an_intact_checkpoint(tmp_path, fast_sets):
    with reward_server(tmp_path, "--reward", "tinyworld_geneval") as served:
        bus, seen = ev.EventBus(), []
        bus.subscribe(seen.append)
        bus.subscribe(lambda e: served.proc.kill() if isinstance(e, ev.IterationFinished) and e.iteration == 1
                      else None)
        cfg = resolve_config("tiny", "sol_rl", reward=f"remote:{served.url}",
                             sets=fast_sets("run.iterations=4", "run.eval_prompts=", "reward.timeout_s=60"))
        t0 = time.monotonic()
        with pytest.raises(RewardFailure) as failed:
            train(cfg, bus, stop=StopFlag())
        assert time.monotonic() - t0 < 120
    assert failed.value.message.startswith(f"reward 'remote:{served.url}' failed (2 tries): reward server "
                                           f"{served.url} is not reachable (ConnectionRefusedError")
    assert "solrl train --resume RUN" in failed.value.fix
    assert [e.reason for e in seen if isinstance(e, ev.RunFinished)] == ["failed"]
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_000001"]
    assert verify(ckpts / "iter_000001") is None


def test_an_unreachable_server_stops_the_run_before_it_starts(tmp_path, fast_sets):
    from tests.serving import free_port

    cfg = resolve_config("tiny", "sol_rl", reward=f"remote:http://127.0.0.1:{free_port()}",
                         sets=fast_sets("run.iterations=1"))
    with pytest.raises(SolrlError, match=r"is not reachable \(ConnectionRefusedError"):
        train(cfg, ev.EventBus(), stop=StopFlag())
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_prompts_the_served_reward_cannot_judge_are_refused_at_start(server):
    remote = RemoteReward(f"remote:{server.url}")
    with pytest.raises(HttpError) as refused:
        remote.check_prompts(["a red circle", "a photo of a dog"])
    assert refused.value.status == 422
    assert "cannot judge prompt 1 ('a photo of a dog')" in refused.value.message
    assert "tinyworld_train" in refused.value.fix  # the reward's own fix, carried over the wire


# ---------------------------------------------------------------- tokens, limits, malformed requests


def test_a_token_guards_every_request(tmp_path):
    with reward_server(tmp_path, "--reward", "tinyworld_geneval", "--token", "s3cret",
                       headers={"Authorization": "Bearer s3cret"}) as served:
        status, answer = request(served.url + "/health")
        assert status == 401 and "token" in answer["detail"]
        prompts, images = noisy_world(2)
        body = {"prompts": prompts, "images": encode_images(images, "uint8")}
        assert _post(served.url + "/score", body, {"Authorization": "Bearer wrong"})[0] == 401
        with pytest.raises(HttpError, match="HTTP 401") as refused:
            RemoteReward(f"remote:{served.url}", token="")
        assert "SOLRL_REWARD_TOKEN" in refused.value.fix
        remote = RemoteReward(f"remote:{served.url}", token="s3cret")
        assert remote.info["token_required"] is True
        assert torch.equal(remote(images, prompts), TinyWorldReward()(images, prompts))


def test_binding_beyond_loopback_without_a_token_is_refused():
    proc = subprocess.run([sys.executable, "-m", "solrl_cli", "reward-server", "--reward", "tinyworld_geneval",
                           "--host", "0.0.0.0", "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "SOLRL_REWARD_TOKEN"},
                               "PYTHONPATH": str(ROOT),
                               "SOLRL_DEBUG": ""})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: serving on 0.0.0.0 (not loopback) without a token" in proc.stderr
    assert "fix: pass --token TOKEN (or set SOLRL_REWARD_TOKEN), or bind to 127.0.0.1" in proc.stderr


def test_oversized_and_malformed_requests_get_a_4xx_with_the_reason_and_disturb_nobody(server):
    prompts, images = noisy_world(2)
    good = {"prompts": prompts, "images": encode_images(images, "uint8")}
    short = dict(good["images"][0], data=base64.b64encode(b"\0" * 10).decode())
    cases = [
        (b"{not json", 400, "body is not JSON"),
        ({"images": good["images"]}, 422, "'prompts', a list of strings"),
        ({**good, "prompts": prompts[:1]}, 422, "2 images but 1 prompts"),
        ({**good, "images": [short, good["images"][1]]}, 422,
         "image 0: 10 bytes of data for shape [32, 32, 3] in uint8"),
        ({**good, "images": [dict(short, data="%%%"), good["images"][1]]}, 422, "image 0: 'data' is not valid base64"),
        ({**good, "images": [dict(short, format="pickle"), good["images"][1]]}, 422, "format 'pickle' is not one of"),
        ({**good, "images": [dict(good["images"][0], shape=[40000, 40000, 3]), good["images"][1]]}, 422, "pixels per "
                                                                                                         "side"),
        ({"prompts": ["a red circle"] * 65, "images": [good["images"][0]] * 65}, 413, "at most 64"),
        ({**good, "prompts": ["a red circle", "a cat"]}, 422, "cannot judge prompt 1 ('a cat')"),
    ]
    for body, status, reason in cases:
        got, answer = _post(server.url + "/score", body)
        assert (got, reason in answer.get("detail", "")) == (status, True), (reason, got, answer)
    status, answer = _post(server.url + "/score", good)  # the server is unharmed
    assert status == 200 and answer["total"] == TinyWorldReward()(images, prompts).tolist()


def test_queued_requests_are_merged_into_batches_of_at_most_the_batch_size():
    rewards = RewardSet({"tinyworld_geneval": 1.0}, RewardContext())
    entered, hold, sizes = threading.Event(), threading.Event(), []

    def score(images, prompts):  # the real reward set, held on its first call until every request is queued
        entered.set()
        hold.wait(30)
        sizes.append(len(prompts))
        return rewards(images, prompts)

    batcher = Batcher(score, batch_size=8)
    prompts, images = noisy_world(16)
    jobs = [(images[i:i + n], prompts[i:i + n]) for i, n in zip((0, 2, 5, 8, 11, 14), (2, 3, 3, 3, 3, 2))]
    futures = [batcher.submit(*jobs[0])]
    assert entered.wait(30)
    futures += [batcher.submit(*job) for job in jobs[1:]]
    hold.set()
    results = [f.result(30) for f in futures]
    assert sizes == [2, 6, 8]  # the first alone (it was being scored), then whole requests up to 8 images, in order
    whole = rewards(images, prompts).total
    assert torch.equal(torch.cat([r.total for r in results]), whole)


# ---------------------------------------------------------------- names, config, doctor


def test_remote_names_survive_weight_lists_and_bad_ones_are_named():
    assert parse_weights("remote:http://10.0.0.2:8000=0.5,tinyworld_geneval") == {"remote:http://10.0.0.2:8000": 0.5,
                                                                                   "tinyworld_geneval": 1.0}
    assert parse_weights("vlm:https://judge.example/v1") == {"vlm:https://judge.example/v1": 1.0}
    with pytest.raises(SolrlError, match="does not name an http"):
        resolve_config("tiny", reward="remote:127.0.0.1:8000")
    with pytest.raises(SolrlError, match="may not hold a query"):
        resolve_config("tiny", reward="remote:http://h:8000/?a")
    with pytest.raises(SolrlError, match="unknown setting reward.remote.modle"):
        resolve_config("tiny", reward="vlm:http://h:8000/v1", sets=["reward.remote.modle=x"])
    with pytest.raises(SolrlError, match="no {prompt}"):
        resolve_config("tiny", reward="vlm:http://h:8000/v1", sets=["reward.remote.template=Is it good?"])


def test_doctor_checks_each_remote_reward(server):
    from solrl_core import doctor
    from tests.serving import free_port

    dead = f"remote:http://127.0.0.1:{free_port()}"
    cfg = resolve_config("tiny", reward=f"remote:{server.url}=1,{dead}=0.5")
    checks = {c.name: c for c in doctor.run_checks(cfg)}
    live = checks[f"reward endpoint remote:{server.url}"]
    assert live.status == "pass" and live.needed_by_run
    assert "solrl reward-server schema 1" in live.detail and "serving tinyworld_geneval=1.0 on cpu" in live.detail
    assert "round trip" in live.detail
    down = checks[f"reward endpoint {dead}"]
    assert down.status == "fail" and "is not reachable (ConnectionRefusedError" in down.detail
    assert doctor.failed_for_run(list(checks.values())) == [down]
