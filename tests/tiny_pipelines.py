"""Tiny random SANA, FLUX.1 and SD3.5 pipelines of the real architectures, saved in the hub's
diffusers layout (model_index.json + one subfolder per component) with no download.

Sizes follow diffusers' own tests (REFERENCE.md section 9). Tokenizers are the real classes
(GemmaTokenizer, CLIPTokenizer, T5Tokenizer) built from a few-hundred-entry vocabulary: a
character-level BPE for Gemma and CLIP, a word-plus-character Unigram for T5.
"""

from __future__ import annotations

from pathlib import Path

import torch

# The offline tokenizers, encoders and VAE live beside the benchmark that builds real-size pipelines
# with them (`solrl bench`); the tests' tiny pipelines use the same ones.
from solrl_core.bench.encoders import (  # noqa: F401
    CHARS,
    WORDS,
    clip_encoder,
    clip_tokenizer,
    gemma_tokenizer,
    kl_vae,
    t5_encoder,
    t5_tokenizer,
)


def sana_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    tokenizer = gemma_tokenizer()
    text_encoder = Gemma2Model(Gemma2Config(head_dim=16, hidden_size=8, intermediate_size=64, num_attention_heads=2,
                                            num_hidden_layers=1, num_key_value_heads=2, vocab_size=len(tokenizer),
                                            pad_token_id=0)).eval()
    blocks = ("ResBlock", "EfficientViTBlock")
    vae = AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=2, encoder_block_types=blocks,
                        decoder_block_types=blocks, encoder_block_out_channels=(8, 8),
                        decoder_block_out_channels=(8, 8),
                        encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                        encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1), downsample_block_type="conv",
                        upsample_block_type="interpolate", decoder_norm_types="rms_norm", decoder_act_fns="silu",
                        scaling_factor=0.41407)
    transformer = SanaTransformer2DModel(patch_size=1, in_channels=4, out_channels=4, num_layers=1,
                                         num_attention_heads=2,
                                         attention_head_dim=4, num_cross_attention_heads=2, cross_attention_head_dim=4,
                                         cross_attention_dim=8, caption_channels=8, sample_size=16)
    return SanaPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


def flux_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    tokenizer, tokenizer_2 = clip_tokenizer(), t5_tokenizer()
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16,
                                         num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                                         axes_dims_rope=[4, 4, 8], guidance_embeds=True)
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=kl_vae(1), transformer=transformer,
                        text_encoder=clip_encoder(tokenizer, 32, 32, with_projection=False), tokenizer=tokenizer,
                        text_encoder_2=t5_encoder(tokenizer_2, 32), tokenizer_2=tokenizer_2)


def sd3_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    tokenizer, tokenizer_2, tokenizer_3 = clip_tokenizer(), clip_tokenizer(), t5_tokenizer()
    # SD3.5-Large's block layout (qk RMSNorm, cropped position embedding), two layers so that the
    # last, context-pre-only block (no to_add_out) is there too.
    transformer = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                                        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                        pooled_projection_dim=64, out_channels=4, qk_norm="rms_norm",
                                        pos_embed_max_size=24)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=kl_vae(4),
        text_encoder=clip_encoder(tokenizer, 16, 32, with_projection=True), tokenizer=tokenizer,
        text_encoder_2=clip_encoder(tokenizer_2, 16, 32, with_projection=True), tokenizer_2=tokenizer_2,
        text_encoder_3=t5_encoder(tokenizer_3, 32), tokenizer_3=tokenizer_3)


def sd35_medium_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import SD3Transformer2DModel

    # SD3.5-Medium's MMDiT-X block layout: qk RMSNorm and a second (dual) self-attention on the image
    # stream in the first blocks (dual_attention_layers), here block 0 of 2.
    pipe = sd3_pipeline()
    pipe.transformer = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2,
                                             attention_head_dim=8,
                                             num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                             pooled_projection_dim=64, out_channels=4, qk_norm="rms_norm",
                                             dual_attention_layers=(0,), pos_embed_max_size=24)
    return pipe


def qwen_tokenizer():  # type: ignore[no-untyped-def]
    """A byte-level BPE Qwen2 tokenizer over the 256 byte symbols (no merges), with the chat markers
    and a Qwen3-style chat template (Z-Image calls apply_chat_template with enable_thinking)."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2TokenizerFast

    tokenizer = Qwen2TokenizerFast(vocab={c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if "
        "add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking "
        "%}<think>\n\n</think>\n\n{% endif %}{% endif %}")
    return tokenizer


def qwen_image_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = qwen_tokenizer()
    # Sizes from diffusers' tests/pipelines/qwenimage/test_qwenimage.py.
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                              attention_head_dim=16,
                                              num_attention_heads=3, joint_attention_dim=16, guidance_embeds=False,
                                              axes_dims_rope=(8, 4, 4))
    vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True],
                                 latents_mean=[0.1, -0.2, 0.05, 0.0], latents_std=[1.5, 0.8, 1.2, 2.0])
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "rope_theta": 1000000.0, "vocab_size": len(tokenizer),
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16, vocab_size=len(tokenizer))
    return QwenImagePipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                             text_encoder=Qwen2_5_VLForConditionalGeneration(config).eval(), tokenizer=tokenizer)


def zimage_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = qwen_tokenizer()
    # Sizes from diffusers' tests/pipelines/z_image/test_z_image.py.
    transformer = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32,
                                           n_layers=2,
                                           n_refiner_layers=1, n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True,
                                           cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0, axes_dims=[8, 4, 4],
                                           axes_lens=[256, 32, 32])
    text_encoder = Qwen3Model(Qwen3Config(hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                                          num_attention_heads=2,
                                          num_key_value_heads=2, vocab_size=len(tokenizer),
                                          max_position_embeddings=512)).eval()
    return ZImagePipeline(transformer=transformer, vae=kl_vae(4), scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                          text_encoder=text_encoder, tokenizer=tokenizer)


def flux2_klein_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import (AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline,
                           Flux2Transformer2DModel)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = qwen_tokenizer()
    # Sizes from diffusers' tests/pipelines/flux2/test_pipeline_flux2_klein.py, with a 2x VAE, non-trivial
    # batch-norm statistics, and 28 text layers so that the pipeline's default layers (9, 18, 27) exist.
    transformer = Flux2Transformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                          attention_head_dim=16,
                                          num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=256,
                                          axes_dims_rope=[4, 4, 4, 4], guidance_embeds=False)
    text_encoder = Qwen3ForCausalLM(Qwen3Config(hidden_size=16, intermediate_size=16, num_hidden_layers=28,
                                                num_attention_heads=2,
                                                num_key_value_heads=2, vocab_size=len(tokenizer),
                                                max_position_embeddings=512)).eval()
    vae = AutoencoderKLFlux2(sample_size=32, in_channels=3, out_channels=3,
                             down_block_types=("DownEncoderBlock2D",) * 2,
                             up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(4, 4), layers_per_block=1,
                             latent_channels=1, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False)
    vae.bn.running_mean.copy_(torch.randn(4) * 0.3)
    vae.bn.running_var.copy_(torch.rand(4) + 0.5)
    return Flux2KleinPipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                              text_encoder=text_encoder, tokenizer=tokenizer, is_distilled=True)


def wan_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import WanTransformer3DModel

    from solrl_core.bench.encoders import umt5_encoder, wan_vae
    from solrl_core.bench.video import WAN_TINY
    from solrl_core.bench.video import wan_pipeline as pipeline

    tokenizer = t5_tokenizer()
    # Sizes from diffusers' tests/pipelines/wan/test_wan.py (the bench's tiny Wan structure, WAN_TINY), with a
    # 4-channel latent whose mean and std are not 0 and 1 (so decode's unnormalisation is checked) and a
    # UMT5 encoder built from config; the VAE compresses 8x in space as the released one.
    transformer = WanTransformer3DModel(**WAN_TINY, in_channels=4, out_channels=4)
    vae = wan_vae(4, levels=3, latents_mean=[0.1, -0.2, 0.05, 0.0], latents_std=[1.5, 0.8, 1.2, 2.0])
    return pipeline(transformer, vae, umt5_encoder(tokenizer, 32), tokenizer, expand_timesteps=False)


def wan22_ti2v_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import WanTransformer3DModel

    from solrl_core.bench.encoders import wan_vae
    from solrl_core.bench.video import WAN_TINY
    from solrl_core.bench.video import wan_pipeline as pipeline

    # Wan 2.2 TI2V 5B's layout, as diffusers' tests build it: a residual VAE over 2x2 pixel patches
    # (16x spatial compression, 48 latent channels) and per-token timesteps (expand_timesteps).
    base = wan_pipeline()
    vae = wan_vae(48, levels=3, patch=2, latents_mean=[0.05 * (i % 5) for i in range(48)],
                  latents_std=[1.0 + 0.1 * (i % 3) for i in range(48)])
    transformer = WanTransformer3DModel(**WAN_TINY, in_channels=48, out_channels=48)
    return pipeline(transformer, vae, base.text_encoder, base.tokenizer, expand_timesteps=True)


BUILDERS = {"sana": sana_pipeline, "flux1": flux_pipeline, "sd3": sd3_pipeline, "sd35_medium": sd35_medium_pipeline,
            "qwen_image": qwen_image_pipeline, "zimage": zimage_pipeline,
            "flux2_klein": flux2_klein_pipeline, "wan21_t2v_1_3b": wan_pipeline,
            "wan22_ti2v_5b": wan22_ti2v_pipeline}


def save_tiny_pipeline(loader: str, folder: str | Path, seed: int = 0) -> Path:
    """Build the tiny random pipeline of `loader` and save it as a hub-layout diffusers folder."""
    torch.manual_seed(seed)
    pipe = BUILDERS[loader]()
    pipe.save_pretrained(str(folder))
    return Path(folder)
