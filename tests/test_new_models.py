"""The explore-copy rules of the presets beyond the official three (SD3.5-Medium, Qwen-Image and
Z-Image; FLUX.2 [klein]'s published configuration is not pinned here) on the published transformer
configurations, built on the meta device (no weights): each preset's comment says which layers its
rule keeps, and this pins it."""

from __future__ import annotations

import diffusers
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.precision.quantize import LayerRule, plan_layers

BLOCKS = ("transformer_blocks.", "layers.", "noise_refiner.", "context_refiner.")


def _kept_and_quantized(name: str, model: torch.nn.Module) -> tuple[dict[str, set[str]], set[str]]:
    """Per rule, the kept layers' names (block layers by their name inside the block), and the
    quantized layers' names inside the blocks."""
    entries = plan_layers(model, LayerRule.of(resolve_config(name, "sol_rl").model))
    inner = {e.name: ".".join(e.name.split(".")[2:]) if e.name.startswith(BLOCKS) else e.name for e in entries}
    kept: dict[str, set[str]] = {}
    for e in entries:
        if not e.quantized:
            kept.setdefault(e.rule, set()).add(inner[e.name])
    return kept, {inner[e.name] for e in entries if e.quantized}


def test_sd35_medium_rule_quantizes_only_the_image_feed_forward():
    with torch.device("meta"):  # stabilityai/stable-diffusion-3.5-medium transformer/config.json
        model = diffusers.SD3Transformer2DModel(
            sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64, num_attention_heads=24,
            joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
            pos_embed_max_size=384, qk_norm="rms_norm", dual_attention_layers=tuple(range(13)))
    kept, quantized = _kept_and_quantized("sd35_medium", model)
    assert quantized == {"ff.net.0.proj", "ff.net.2"}
    # Both attentions (1536 wide) stay by size, as does the final projection.
    assert {"attn.to_q", "attn.to_add_out", "attn2.to_q", "attn2.to_out.0", "proj_out"} <= kept["min_dim"]
    assert {"norm1.linear", "norm1_context.linear", "ff_context.net.0.proj"} <= kept["name"]


def test_qwen_image_and_zimage_rules_keep_only_the_named_layers():
    with torch.device("meta"):  # Qwen/Qwen-Image and Tongyi-MAI/Z-Image-Turbo transformer/config.json
        qwen = diffusers.QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                                                     num_attention_heads=24,
            joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))
        zimage = diffusers.ZImageTransformer2DModel(
            all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=3840, n_layers=30, n_refiner_layers=2,
            n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True, cap_feat_dim=2560, rope_theta=256.0, t_scale=1000.0,
            axes_dims=[32, 48, 48], axes_lens=[1024, 512, 512])
    assert round(sum(p.numel() for p in qwen.parameters()) / 1e9, 1) == 20.4  # the footprint's transformer size
    kept, quantized = _kept_and_quantized("qwen_image", qwen)
    assert set(kept) == {"name"}  # nothing is 1000 wide or less
    assert {k.split(".")[0] for k in kept["name"]} == {"img_in", "txt_in", "time_text_embed", "norm_out"}
    assert {"attn.to_q", "attn.add_q_proj", "img_mlp.net.0.proj", "txt_mlp.net.2", "img_mod.1"} <= quantized
    kept, quantized = _kept_and_quantized("zimage", zimage)
    assert set(kept) == {"name"}
    assert {k.split(".")[0] for k in kept["name"]} == {"all_x_embedder", "cap_embedder", "t_embedder",
                                                       "all_final_layer"}
    assert {"attention.to_q", "attention.to_out.0", "feed_forward.w1", "adaLN_modulation.0"} <= quantized


def test_hub_download_keeps_the_qwen_tokenizers_chat_template():
    # Z-Image's encode_prompt applies the tokenizer's chat template, which newer tokenizers keep in
    # chat_template.jinja: a download without it could not encode a prompt.
    from solrl_core.models.diffusers_models import select_files

    files = ["model_index.json", "tokenizer/tokenizer_config.json", "tokenizer/vocab.json", "tokenizer/merges.txt",
             "tokenizer/chat_template.jinja", "tokenizer/README.md"]
    wanted = set(select_files(files, ("tokenizer",), torch.bfloat16))
    assert "tokenizer/chat_template.jinja" in wanted and "tokenizer/README.md" not in wanted
