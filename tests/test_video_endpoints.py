"""A video model's clips through the rewards behind a URL: the wire's `videos` (every frame, the frame
sampling and combination of the run), a reward server scoring them as the same rewards in process do,
a VLM judge asked once per clip about its frames, and the one-line refusals both ways (a server of
still-image rewards on a video run, a server of clip rewards on an image run)."""

from __future__ import annotations

import json

import pytest
import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards import RewardSet
from solrl_core.rewards.endpoints import check_media
from solrl_core.rewards.names import judged_media
from solrl_core.rewards.wire import decode_clips, encode_clips
from tests.serving import request, reward_server, serve
from tests.helpers import noisy_world
from tests.helpers import clip_dir  # noqa: F401,F811  (fixtures, used by name)


def random_clips(b=3, f=5, side=32, seed=0):
    return torch.rand(b, f, 3, side, side, generator=torch.Generator().manual_seed(seed))


def test_clips_cross_the_wire_frame_for_frame():
    clips = random_clips(2, 3)
    assert torch.equal(decode_clips(encode_clips(clips, "float32"), 64, 10**7), clips)
    back = decode_clips(encode_clips(clips, "uint8"), 64, 10**7)
    assert back.shape == (2, 3, 3, 32, 32) and (back - clips).abs().max() <= 0.5 / 255 + 1e-6
    uneven = encode_clips(clips, "uint8")
    uneven[1]["frames"].pop()
    with pytest.raises(ValueError, match="one frame count; got \\[2, 3\\]"):
        decode_clips(uneven, 64, 10**7)


def test_what_a_server_judges_follows_its_rewards_and_a_mismatch_is_one_line():
    assert judged_media(["tinyworld_geneval"]) == ["image"]  # still images only
    assert judged_media(["jpeg_compressibility"]) == ["image", "video"]  # an image reward scores a clip's frames
    assert judged_media(["jpeg_compressibility", "temporal_consistency"]) == ["video"]
    for media, video, words in ((("image",), True, "judges only still images and this model makes videos"),
                                (("video",), False, "judges only videos and this model makes images")):
        with pytest.raises(SolrlError, match=words) as err:
            check_media("remote:http://h:1", media, video)
        assert "\n" not in str(err.value) and err.value.fix
    check_media("remote:http://h:1", ("image", "video"), True)


@pytest.fixture(scope="module")
def clip_server(tmp_path_factory, clip_dir):  # noqa: F811
    with reward_server(tmp_path_factory.mktemp("clip-server"), "--reward",
                       "jpeg_compressibility=1,temporal_consistency=0.5",
                       "--path", f"temporal_consistency={clip_dir}", "--max-images", "64") as served:
        yield served


def test_a_reward_server_scores_clips_as_its_rewards_do_in_process(clip_server, clip_dir):  # noqa: F811
    weights = {"jpeg_compressibility": 1.0, "temporal_consistency": 0.5}
    # on uint8's grid: the wire sends them exactly
    clips, prompts = (random_clips(3, 5) * 255).round() / 255, ["a", "b", "c"]
    name = f"remote:{clip_server.url}"
    for frames, reduce in ((0, "mean"), (3, "min")):
        local = RewardSet(weights, paths={"temporal_consistency": str(clip_dir)}, video_frames=frames,
                          frame_reduce=reduce)
        remote = RewardSet({name: 1.0}, video_frames=frames, frame_reduce=reduce)
        assert remote.rewards[name].media == ("video",)
        assert torch.allclose(remote(clips, prompts).total, local(clips, prompts).total, atol=1e-6), (frames, reduce)
    assert not torch.allclose(RewardSet(weights, paths={"temporal_consistency": str(clip_dir)},
                                        frame_reduce="min")(clips, prompts).total,
                              RewardSet(weights, paths={"temporal_consistency": str(clip_dir)})(clips, prompts).total)
    # The reverse: this server judges clips only, so an image run is refused, in one line, by the client
    with pytest.raises(SolrlError, match="judges only videos and this model makes images"):
        remote(clips[:, 0], prompts)
    # ... and by the server itself, to a client that sends images anyway.
    from solrl_core.rewards.wire import encode_images

    status, answer = request(f"{clip_server.url}/score",
                             json.dumps({"prompts": ["a"], "images": encode_images(clips[:1, 0], "uint8")}).encode())
    assert status == 422 and "do not judge images" in answer["detail"]
    status, answer = request(f"{clip_server.url}/score",
                             json.dumps({"prompts": ["a"], "videos": encode_clips(clips[:1], "uint8"),
                                                                     "frame_reduce": "max"}).encode())
    assert status == 422 and "frame_reduce 'max'" in answer["detail"]


def test_a_server_of_still_image_rewards_refuses_a_video_run(tmp_path):
    from solrl_core.config.presets import resolve_config
    from solrl_core.config.run_inputs import check_inputs

    with reward_server(tmp_path, "--reward", "tinyworld_geneval") as served:
        name = f"remote:{served.url}"
        cfg = resolve_config("wan21_t2v_1_3b", "sol_rl", name,
                             sets=["run.prompts=tiny", "run.eval_prompts=", "run.device=cpu"])
        with pytest.raises(SolrlError, match="judges only still images and this model makes videos") as err:
            check_inputs(cfg)  # before anything loads
        assert "\n" not in str(err.value)
        status, answer = request(f"{served.url}/score", json.dumps({"prompts": ["a red circle"],
                                                                   "videos": encode_clips(random_clips(1, 2),
                                                                                          "uint8")}).encode())
        assert status == 422 and "do not judge videos" in answer["detail"]
        prompts, images = noisy_world(2)  # images still score
        assert RewardSet({name: 1.0})(images, prompts).total.shape == (2,)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    pytest.importorskip("openai")
    with serve(["-m", "tests.vlm_server", "--model", "tiny-judge"], "/v1/models",
               tmp_path_factory.mktemp("vlm")) as served:
        yield served


def test_a_vlm_judges_a_clip_once_from_its_sampled_frames(vlm):
    from solrl_core.rewards.vlm import VlmJudge

    prompts, images = noisy_world(6, seed=1)
    clip = images[None]  # six tiny-world frames as one clip, judged against the first caption
    judge = VlmJudge(f"vlm:{vlm.url}/v1", {}, video_frames=3)
    body = judge.request([b"a", b"b", b"c"], prompts[0])
    parts = body["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url"] * 3 + ["text"]
    assert (parts[-1]["text"] == f'The images are frames of one video, in order. Does this video show "{prompts[0]}"? '
                                 f'Answer yes or no.')
    score = judge(clip, prompts[:1])
    frames = judge(images[[0, 2, 5]], prompts[:1] * 3)  # the three sampled frames (first, middle, last), one at a time
    assert len(set(frames.tolist())) > 1  # they differ: the clip's score is their combination, not one frame's
    assert score.shape == (1,) and score.item() == pytest.approx(frames.mean().item(), abs=1e-6)  # the stand-in's mean
    via_set = RewardSet({f"vlm:{vlm.url}/v1": 1.0}, video_frames=3)
    assert via_set(clip, prompts[:1]).total.item() == pytest.approx(score.item(), abs=1e-6)
