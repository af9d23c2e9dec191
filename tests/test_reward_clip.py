"""PickScore, CLIPScore and HPSv2 rewards on tiny random models saved in the hub layouts: loading
through the registry, the score formulas on chosen embeddings, tensor preprocessing against the
processor's own, and errors that name what is missing. Offline and CPU-only."""

from __future__ import annotations

import json
import math
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
import torch.nn.functional as F
import transformers.models.clip
from PIL import Image
from transformers import (
    CLIPImageProcessor,
)
from transformers.modeling_outputs import BaseModelOutputWithPooling

open_clip = pytest.importorskip("open_clip", reason="needs the rewards extra: pip install -e '.[rewards]'")

from solrl_core.errors import SolrlError  # noqa: E402
from solrl_core.rewards import RewardContext, build_reward
from solrl_core.rewards.clip_rewards import ClipScore, PickScore, processor_geometry
from solrl_core.rewards.hpsv2 import CHECKPOINT, HPSv2
from solrl_core.rewards.preprocess import resize_crop_normalize
from tests.helpers import tiny_image_processor
from tests.helpers import clip_dir  # noqa: F401,F811  (fixtures, used by name)

# transformers 5's CLIPImageProcessor resizes with torchvision; its PIL pipeline is CLIPImageProcessorPil
# (transformers 4 has only the PIL one, under the first name). Both are compared.
IMAGE_PROCESSORS = [CLIPImageProcessor] + [c for c in [getattr(transformers.models.clip, "CLIPImageProcessorPil", None)]
                                           if c]

HPS_CONFIG = {"embed_dim": 32,
              "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 8, "patch_size": 16},
              "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 1}}

# Chosen embeddings for two image/prompt pairs. cos(image i, text j):
# [[0.707, 0.0], [1.0, 0.5]]: the diagonal differs from the first row and from the first column.
IMAGE_EMB = torch.tensor([[3.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
TEXT_EMB = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
DIAGONAL_COS = torch.tensor([1 / math.sqrt(2), 0.5])


def hps_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return open_clip.CLIP(**HPS_CONFIG)


def save_hps(folder: Path, model: torch.nn.Module, wrapped: bool = True) -> None:
    """The checkpoint as hpsv2 ships it ({'state_dict': ...}) or as a DataParallel 'module.' state dict."""
    folder.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    torch.save({"state_dict": state} if wrapped else {f"module.{k}": v for k, v in state.items()}, folder / CHECKPOINT)
    (folder / "open_clip_config.json").write_text(json.dumps(HPS_CONFIG))


def images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, 40, 56, generator=torch.Generator().manual_seed(seed))


PROMPTS = ["a red cube", "two cats on a sofa", "a lighthouse at dusk, oil painting"]


@pytest.mark.parametrize("name, cls", [("pickscore", PickScore), ("clipscore", ClipScore)])
def test_clip_rewards_load_a_saved_folder_and_score(clip_dir, name, cls):
    reward = build_reward(name, RewardContext(path=str(clip_dir), batch_size=2))
    assert isinstance(reward, cls) and reward.name == name
    assert (reward.size, reward.crop) == (32, 32)
    x = images(3)
    scores = reward(x, PROMPTS)
    assert scores.shape == (3,) and scores.dtype == torch.float32 and torch.isfinite(scores).all()
    assert torch.equal(scores, reward(x, PROMPTS))
    whole = build_reward(name, RewardContext(path=str(clip_dir), batch_size=3))(x, PROMPTS)
    torch.testing.assert_close(scores, whole)  # chunking does not change scores


@pytest.mark.parametrize("as_output", [True, False], ids=["model-output", "tensor"])
@pytest.mark.parametrize("name, divisor", [("pickscore", 26.0), ("clipscore", 100.0)])
def test_clip_formula_is_scaled_cosine_on_the_diagonal(clip_dir, monkeypatch, name, divisor, as_output):
    """transformers 5 returns a model output from get_*_features, 4 a tensor: both must score alike."""
    reward = build_reward(name, RewardContext(path=str(clip_dir)))
    wrap = (lambda t: BaseModelOutputWithPooling(pooler_output=t)) if as_output else (lambda t: t)

    def image_features(pixel_values):
        assert pixel_values.shape == (2, 3, 32, 32)
        return wrap(IMAGE_EMB)

    def text_features(input_ids, attention_mask):
        assert input_ids.shape == attention_mask.shape == (2, 77)
        return wrap(TEXT_EMB)

    monkeypatch.setattr(reward.model, "get_image_features", image_features)
    monkeypatch.setattr(reward.model, "get_text_features", text_features)
    reward.model.logit_scale.data.fill_(math.log(20.0))
    torch.testing.assert_close(reward(images(2), PROMPTS[:2]), 20.0 * DIAGONAL_COS / divisor)


# (40, 56): size * long / short is fractional, and processors floor it; (20, 30): enlarging, where
# PIL's bicubic kernel (a = -0.5) differs from torch's plain one (a = -0.75) unless antialiased.
@pytest.mark.parametrize("shape", [(48, 80), (80, 48), (40, 56), (20, 30)],
                         ids=["wide", "tall", "fractional-long-side", "upscale"])
@pytest.mark.parametrize("backend", IMAGE_PROCESSORS, ids=lambda c: c.__name__)
def test_tensor_preprocessing_matches_the_image_processor(backend, shape):
    """A smooth random image: PIL rounds to uint8 between its two resize passes, which on pixel noise
    alone would dominate the comparison."""
    processor = tiny_image_processor(backend)
    field = torch.rand(1, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    array = (F.interpolate(field, size=shape, mode="bilinear")[0].permute(1, 2, 0)
             * 255).round().to(torch.uint8).numpy()
    expected = processor(images=Image.fromarray(array), return_tensors="pt")["pixel_values"]
    tensor = torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255
    ours = resize_crop_normalize(tensor, *processor_geometry(processor))
    assert ours.shape == expected.shape == (1, 3, 32, 32)
    diff = (ours - expected).abs().max().item()
    print(f"{backend.__name__} {shape}: max |tensor - processor| = {diff:.4f}")
    assert diff < 0.05


@pytest.mark.parametrize("wrapped, as_file", [(True, False), (False, True)], ids=["state_dict-folder", "module-file"])
def test_hpsv2_loads_its_checkpoint_and_scores(tmp_path, wrapped, as_file):
    model = hps_model()
    save_hps(tmp_path, model, wrapped)
    path = tmp_path / CHECKPOINT if as_file else tmp_path
    reward = build_reward("hpsv2", RewardContext(path=str(path), batch_size=2))
    assert isinstance(reward, HPSv2) and (reward.size, reward.mean) == (32, list(open_clip.OPENAI_DATASET_MEAN))
    x = images(3)
    scores = reward(x, PROMPTS)
    assert scores.shape == (3,) and scores.dtype == torch.float32 and torch.isfinite(scores).all()
    assert torch.equal(scores, reward(x, PROMPTS))
    with torch.no_grad():  # the saved weights, not a fresh random init, produced the scores
        pixels = resize_crop_normalize(x, 32)
        image = model.encode_image(pixels, normalize=True)
        text = model.encode_text(open_clip.get_tokenizer("ViT-H-14")(PROMPTS), normalize=True)
    torch.testing.assert_close(scores, (image @ text.T).diagonal())


def test_hpsv2_formula_is_the_normalised_dot_product_on_the_diagonal(tmp_path, monkeypatch):
    save_hps(tmp_path, hps_model())
    reward = build_reward("hpsv2", RewardContext(path=str(tmp_path)))
    monkeypatch.setattr(reward.model, "encode_image", lambda pixels: IMAGE_EMB)
    monkeypatch.setattr(reward.model, "encode_text", lambda tokens: TEXT_EMB)
    torch.testing.assert_close(reward(images(2), PROMPTS[:2]), DIAGONAL_COS)


def test_hpsv2_folder_without_the_checkpoint_names_it(tmp_path):
    with pytest.raises(SolrlError, match=CHECKPOINT):
        build_reward("hpsv2", RewardContext(path=str(tmp_path)))


def test_hpsv2_checkpoint_of_another_architecture_is_named(tmp_path):
    save_hps(tmp_path, hps_model())
    other = dict(HPS_CONFIG, embed_dim=16)
    (tmp_path / "open_clip_config.json").write_text(json.dumps(other))
    with pytest.raises(SolrlError, match="does not fit the open_clip architecture"):
        build_reward("hpsv2", RewardContext(path=str(tmp_path)))


def test_hpsv2_config_without_model_keys_is_named(tmp_path):
    save_hps(tmp_path, hps_model())
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": HPS_CONFIG}))
    with pytest.raises(SolrlError, match="lacks embed_dim, vision_cfg, text_cfg"):
        build_reward("hpsv2", RewardContext(path=str(tmp_path)))


@pytest.mark.parametrize("name", ["pickscore", "clipscore"])
def test_clip_folder_without_the_model_names_what_is_missing(tmp_path, name):
    with pytest.raises(SolrlError, match="config.json"):
        build_reward(name, RewardContext(path=str(tmp_path)))
    (tmp_path / "config.json").write_text("{}")  # a model config but no processor: still one clear error
    with pytest.raises(SolrlError, match="save_pretrained"):
        build_reward(name, RewardContext(path=str(tmp_path)))


@pytest.mark.parametrize("name, hub_id", [("pickscore", "yuvalkirstain/PickScore_v1"),
                                          ("clipscore", "openai/clip-vit-large-patch14"),
                                          ("hpsv2", "xswu/HPSv2")])
def test_offline_without_a_path_names_the_hub_id(tmp_path, monkeypatch, name, hub_id):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the environment once at import: set its constants too, and an empty cache.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(SolrlError) as err:
        build_reward(name, RewardContext())
    assert hub_id in str(err.value) and f"reward.paths.{name}=DIR" in str(err.value)
