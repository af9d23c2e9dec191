"""The ImageReward reward, offline: a tiny random model of the real architecture, saved in the hub
repository's layout, loads through the registry and scores as ImageReward's `score_gard` does."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards import RewardContext, build_reward
from solrl_core.rewards.imagereward import ImageRewardScore, VisionSize, vision_size
from solrl_core.rewards.preprocess import resize_crop_normalize

# Not importorskip: `import ImageReward` fails without compat's shims, which is what is under test.
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("ImageReward", "timm", "fairscale")),
                                reason="needs the image-reward package (solrl[rewards])")

PROMPTS = ["a red cat on the grass", "a blue dog", "two green birds"]
WORDS = sorted({w for p in PROMPTS for w in p.split()})
# The real med_config.json's keys (BERT-base with cross-attention), at a tiny size.
MED_CONFIG = {
    "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 64, "model_type": "bert", "num_attention_heads": 2,
    "num_hidden_layers": 1, "pad_token_id": 0, "type_vocab_size": 2,
    "vocab_size": 5 + len(WORDS) + 2,  # [PAD] [UNK] [CLS] [SEP] [MASK], the words, then [DEC] [ENC]
    "encoder_width": 768, "add_cross_attention": True,
}


def tiny_state(tmp: Path) -> dict[str, torch.Tensor]:
    """A random ImageReward state dict: ViT embed 64, depth 1, patch 16 at 32 px; BERT hidden 32."""
    from solrl_core.rewards.compat import import_image_reward

    ir = import_image_reward()
    torch.manual_seed(0)
    (tmp / "med.json").write_text(json.dumps(MED_CONFIG))
    config = ir.BertConfig.from_json_file(str(tmp / "med.json"))
    config.encoder_width = 64
    parts = {"blip.visual_encoder": ir.VisionTransformer(img_size=32, patch_size=16, embed_dim=64, depth=1,
                                                         num_heads=1),
             "blip.text_encoder": ir.BertModel(config=config, add_pooling_layer=False),
             "mlp": ir.MLP(32)}
    for layer in parts["mlp"].layers:  # the package's init gives outputs ~1e-3; make them O(1)
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.normal_(layer.weight, std=layer.in_features ** -0.5)
            torch.nn.init.normal_(layer.bias, std=0.1)
    state = {f"{prefix}.{k}": v for prefix, m in parts.items() for k, v in m.state_dict().items()}
    state["blip.vision_proj.weight"] = torch.randn(8, 64)  # in the real checkpoint, unused by the reward
    state["blip.text_proj.weight"] = torch.randn(8, 32)
    return state


def write_repo(folder: Path, state: dict[str, torch.Tensor]) -> Path:
    """The hub repository's layout: ImageReward.pt, med_config.json, and a saved tokenizer/."""
    from transformers import BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "ImageReward.pt")
    (folder / "med_config.json").write_text(json.dumps(MED_CONFIG))
    vocab = folder.parent / f"{folder.name}-vocab"
    vocab.mkdir(exist_ok=True)
    (vocab / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertTokenizer.from_pretrained(str(vocab)).save_pretrained(str(folder / "tokenizer"))
    return folder


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    tmp = tmp_path_factory.mktemp("imagereward")
    state = tiny_state(tmp)
    return write_repo(tmp / "repo", state), state


@pytest.fixture(scope="module")
def reward(repo) -> ImageRewardScore:
    return build_reward("imagereward", RewardContext(path=str(repo[0]), batch_size=2))  # type: ignore[return-value]


def images(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 3, 40, 48, generator=torch.Generator().manual_seed(seed))


def test_tiny_checkpoint_loads_through_the_registry_and_scores(reward):
    tower = reward.net.blip.visual_encoder
    assert isinstance(reward, ImageRewardScore) and reward.name == "imagereward"
    assert (reward.image_size, tower.embed_dim, len(tower.blocks), tower.blocks[0].attn.num_heads) == (32, 64, 1, 1)
    assert not reward.net.training
    x = images()
    scores = reward(x, PROMPTS)
    assert scores.shape == (3,) and scores.dtype == torch.float32 and scores.device.type == "cpu"
    assert torch.isfinite(scores).all()
    assert torch.equal(scores, reward(x, PROMPTS))  # deterministic: eval mode, no dropout
    same_prompt = reward(x, [PROMPTS[0]] * 3)
    assert len(set(same_prompt.tolist())) == 3  # different images, different scores
    # batch-independent
    assert torch.allclose(reward(x[[2, 0, 1]], [PROMPTS[0]] * 3), same_prompt[[2, 0, 1]], atol=1e-6)


def test_reward_is_the_normalised_mlp_of_the_cls_feature(reward):
    """(mlp(text_encoder(prompt, cross-attending to visual_encoder(image))[:, 0]) - mean) / std."""
    x = images(seed=2)
    net = reward.net
    tokens = reward.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert tokens.input_ids.shape == (3, 35)
    with torch.no_grad():
        image_embeds = net.blip.visual_encoder(resize_crop_normalize(x, 32))
        text = net.blip.text_encoder(tokens.input_ids, attention_mask=tokens.attention_mask,
                                     encoder_hidden_states=image_embeds,
                                     encoder_attention_mask=torch.ones(image_embeds.shape[:2], dtype=torch.long),
                                     return_dict=True)
        expected = (net.mlp(text.last_hidden_state[:, 0]).squeeze(-1) - 0.16717362830052426) / 1.0333394966054072
    assert torch.allclose(reward(x, PROMPTS), expected, atol=1e-5)
    # A head that always outputs 1.0 scores (1 - mean) / std for every image.
    constant = copy.deepcopy(net)
    constant.mlp.layers[-1].weight.data.zero_()
    constant.mlp.layers[-1].bias.data.fill_(1.0)
    scores = ImageRewardScore(constant, reward.tokenizer, 32, RewardContext())(x, PROMPTS)
    assert torch.allclose(scores, torch.full((3,), 0.8059562), atol=1e-6)


def test_bfloat16_context_runs_in_bfloat16_and_returns_float32(repo, reward):
    bf16 = build_reward("imagereward", RewardContext(path=str(repo[0]), dtype=torch.bfloat16, batch_size=3))
    assert next(bf16.net.parameters()).dtype == torch.bfloat16  # type: ignore[attr-defined]
    x = images()
    scores = bf16(x, PROMPTS)
    assert scores.dtype == torch.float32
    assert torch.allclose(scores, reward(x, PROMPTS), atol=0.05)


def test_vision_size_of_the_real_checkpoint_is_vit_large_16_224():
    meta = {"blip.visual_encoder.patch_embed.proj.weight": torch.empty(1024, 3, 16, 16, device="meta"),
            "blip.visual_encoder.pos_embed": torch.empty(1, 197, 1024, device="meta"),
            "blip.visual_encoder.cls_token": torch.empty(1, 1, 1024, device="meta")}
    for i in range(24):
        meta[f"blip.visual_encoder.blocks.{i}.attn.qkv.weight"] = torch.empty(3072, 1024, device="meta")
        meta[f"blip.visual_encoder.blocks.{i}.mlp.fc1.weight"] = torch.empty(4096, 1024, device="meta")
    meta["blip.text_encoder.encoder.layer.11.crossattention.self.key.weight"] = torch.empty(768, 1024, device="meta")
    assert vision_size(meta) == VisionSize(image_size=224, patch_size=16, embed_dim=1024, depth=24, num_heads=16,
                                           mlp_ratio=4.0)


def test_vision_size_of_the_tiny_checkpoint(repo):
    assert vision_size(repo[1]) == VisionSize(image_size=32, patch_size=16, embed_dim=64, depth=1, num_heads=1,
                                              mlp_ratio=4.0)


def test_a_folder_without_the_checkpoint_is_named(tmp_path):
    (tmp_path / "med_config.json").write_text(json.dumps(MED_CONFIG))
    with pytest.raises(SolrlError, match="ImageReward.pt") as err:
        build_reward("imagereward", RewardContext(path=str(tmp_path)))
    assert "imagereward" in str(err.value)
    with pytest.raises(SolrlError, match=r"reward\.paths\.imagereward"):
        build_reward("imagereward", RewardContext(path=str(tmp_path / "absent")))


def test_offline_without_a_path_names_the_hub_repo(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read once at import
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    with pytest.raises(SolrlError, match="THUDM/ImageReward") as err:
        build_reward("imagereward", RewardContext())
    assert "reward.paths.imagereward" in str(err.value)


def test_a_checkpoint_missing_a_used_weight_names_it(repo, tmp_path):
    state = dict(repo[1])
    del state["blip.text_encoder.encoder.layer.0.crossattention.self.key.weight"]
    del state["blip.vision_proj.weight"]  # unused: not reported
    folder = write_repo(tmp_path / "repo", state)
    with pytest.raises(SolrlError, match=r"lacks 1 weights.*crossattention\.self\.key\.weight"):
        build_reward("imagereward", RewardContext(path=str(folder)))


def test_compat_imports_image_reward_and_leaves_no_clip_behind():
    import transformers.modeling_utils as modeling_utils

    import solrl_core.rewards.compat as compat

    clip_before = "clip" in sys.modules
    ir = compat.import_image_reward()
    assert {"VisionTransformer", "BertConfig", "BertModel", "MLP"} <= set(vars(ir))
    again = compat.import_image_reward.__wrapped__()  # the patches are idempotent
    assert again.BertModel is ir.BertModel and again.VisionTransformer is ir.VisionTransformer
    assert ("clip" in sys.modules) == clip_before
    for name in ("apply_chunking_to_forward", "find_pruneable_heads_and_indices", "prune_linear_layer"):
        assert callable(getattr(modeling_utils, name))
    if importlib.util.find_spec("clip") is None:  # not installed: the placeholder was used, then removed
        assert "clip" not in sys.modules
        placeholder = sys.modules["ImageReward.models.CLIPScore"].clip
        with pytest.raises(ImportError, match="CLIP"):
            placeholder.load("ViT-L/14")


def test_compat_shims_match_transformers_4():
    from solrl_core.rewards.compat import (
        find_pruneable_heads_and_indices,
        get_head_mask,
        invert_attention_mask,
    )

    class Model(torch.nn.Module):
        dtype = torch.float32

    model = Model()
    bias = invert_attention_mask(model, torch.tensor([[1, 0]]))
    assert bias.shape == (1, 1, 1, 2) and bias[0, 0, 0, 0] == 0 and bias[0, 0, 0, 1] == torch.finfo(torch.float32).min
    assert get_head_mask(model, None, 3) == [None, None, None]
    assert get_head_mask(model, torch.ones(4), 3).shape == (3, 1, 4, 1, 1)
    assert get_head_mask(model, torch.ones(3, 4), 3).shape == (3, 1, 4, 1, 1)
    # Of original heads 0, 1, 2, head 0 is already gone: pruning 2 drops the second of the two left.
    heads, index = find_pruneable_heads_and_indices([2], n_heads=2, head_size=2, already_pruned_heads={0})
    assert heads == {2} and index.tolist() == [0, 1]
