"""Offline stand-ins for the parts of a pipeline a benchmark does not time closely: tokenizers of the
real classes built from a few-hundred-entry vocabulary (a character-level BPE for Gemma and CLIP, a
word-plus-character Unigram for T5 and UMT5), one- or two-layer text encoders of a chosen width, a
two-block VAE and a small Wan video VAE. Nothing is downloaded; the tests' tiny pipelines use them too."""

from __future__ import annotations

import string

WORDS = ("a an the photo of cat dog red blue green circle square and on in with left right above below "
         "one two three small large").split()
CHARS = string.ascii_lowercase + string.digits + ".,'\"!?:-"


def gemma_tokenizer():  # type: ignore[no-untyped-def]
    from transformers import GemmaTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    vocab = {tok: i for i, tok in enumerate([*specials, "▁", *CHARS])}
    return GemmaTokenizerFast(vocab=vocab, merges=[])


def clip_tokenizer():  # type: ignore[no-untyped-def]
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in CHARS:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def t5_tokenizer():  # type: ignore[no-untyped-def]
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [("▁" + w, -1.0) for w in WORDS] + [(c, -5.0) for c in CHARS]
    return T5TokenizerFast(vocab=pieces, extra_ids=0)


def gemma_encoder(tokenizer, hidden: int, head_dim: int):  # type: ignore[no-untyped-def]
    """One Gemma2 layer whose output width is `hidden` (SANA's caption_channels)."""
    from transformers import Gemma2Config, Gemma2Model

    return Gemma2Model(Gemma2Config(head_dim=head_dim, hidden_size=hidden, intermediate_size=512 if hidden > 64 else 64,
                                    num_attention_heads=2, num_hidden_layers=1,
                                    num_key_value_heads=1 if hidden > 64 else 2,
                                    vocab_size=len(tokenizer), pad_token_id=0)).eval()


def clip_encoder(tokenizer, hidden: int, projection: int, with_projection: bool):  # type: ignore[no-untyped-def]
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(hidden_size=hidden, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                            vocab_size=len(tokenizer), projection_dim=projection, max_position_embeddings=77,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config).eval()


def t5_encoder(tokenizer, d_model: int):  # type: ignore[no-untyped-def]
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(d_model=d_model, d_ff=37, d_kv=8, num_layers=1, num_heads=4,
                                   vocab_size=len(tokenizer),
                                   relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1)).eval()


def umt5_encoder(tokenizer, d_model: int):  # type: ignore[no-untyped-def]
    """One UMT5 layer whose output width is `d_model` (Wan's text_dim: UMT5-XXL's 4096)."""
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(d_model=d_model, d_ff=37, d_kv=8, num_layers=1, num_heads=4,
                                       vocab_size=len(tokenizer),
                                       relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1)).eval()


def wan_vae(z_dim: int, levels: int, patch: int = 1, base_dim: int = 3, latents_mean: list[float] | None = None,
            latents_std: list[float] | None = None):  # type: ignore[no-untyped-def]
    """A small AutoencoderKLWan: `levels` 2x spatial down-samplings, the last two also 2x in time (4x:
    the first frame alone, then one latent frame per 4, as the released Wan VAEs), one residual block
    per level; `patch` 2 adds Wan 2.2's 2x2 pixel patches (a residual VAE, 2x more spatial compression).
    Spatial compression: patch x 2^levels. Latent statistics default to mean 0, std 1."""
    from diffusers import AutoencoderKLWan

    residual = {} if patch == 1 else dict(in_channels=3 * patch * patch, out_channels=3 * patch * patch,
                                          is_residual=True,
                                          patch_size=patch)
    return AutoencoderKLWan(base_dim=base_dim, z_dim=z_dim, dim_mult=[1] * (levels + 1), num_res_blocks=1,
                            temperal_downsample=[False] * (levels - 2) + [True, True],
                            latents_mean=latents_mean or [0.0] * z_dim, latents_std=latents_std or [1.0] * z_dim,
                            scale_factor_spatial=patch * 2 ** levels, scale_factor_temporal=4, **residual)


def kl_vae(latent_channels: int):  # type: ignore[no-untyped-def]
    """A two-block AutoencoderKL: 2x spatial compression (the real ones compress 8x)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4, 4),
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         layers_per_block=1, latent_channels=latent_channels, norm_num_groups=1, use_quant_conv=False,
                         use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)


def published_kl_vae(scaling_factor: float, shift_factor: float):  # type: ignore[no-untyped-def]
    """The released FLUX.1 / SD3.5 AutoencoderKL's architecture (four blocks of 128-512 channels, two
    layers each, 16 latent channels, 8x compression), random weights."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512),
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         layers_per_block=2, latent_channels=16, norm_num_groups=32, sample_size=1024,
                         use_quant_conv=False, use_post_quant_conv=False, scaling_factor=scaling_factor,
                         shift_factor=shift_factor)


def dc_vae(latent_channels: int, widths: tuple[int, int] = (32, 64)):  # type: ignore[no-untyped-def]
    """A two-block AutoencoderDC (SANA's): 2x spatial compression (the real one compresses 32x)."""
    from diffusers import AutoencoderDC

    blocks = ("ResBlock", "EfficientViTBlock")
    return AutoencoderDC(in_channels=3, latent_channels=latent_channels, attention_head_dim=8 if widths[0] >= 32 else 2,
                         encoder_block_types=blocks, decoder_block_types=blocks, encoder_block_out_channels=widths,
                         decoder_block_out_channels=widths, encoder_qkv_multiscales=((), (5,)),
                         decoder_qkv_multiscales=((), (5,)), encoder_layers_per_block=(1, 1),
                         decoder_layers_per_block=(1, 1), downsample_block_type="conv",
                         upsample_block_type="interpolate",
                         decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407)


# CLIP ViT-H/14, the architecture of PickScore_v1 (yuvalkirstain/PickScore_v1 config.json): 0.99B parameters.
CLIP_H14 = dict(text=dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24),
                vision=dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=16, num_hidden_layers=32),
                projection_dim=1024, vocab_size=49408)
CLIP_TINY = dict(text=dict(hidden_size=32, intermediate_size=37, num_attention_heads=2, num_hidden_layers=1),
                 vision=dict(hidden_size=32, intermediate_size=37, num_attention_heads=2, num_hidden_layers=1),
                 projection_dim=32, vocab_size=None)


def save_clip_reward(folder, size: str, device, dtype):  # type: ignore[no-untyped-def]
    """A random-weight CLIPModel of PickScore's architecture (`size` "real"; "tiny": a one-layer one)
    with its processor (224 px crop, the character-level tokenizer), saved as one folder: what the
    `pickscore` reward loads from reward.paths. Created on `device` in `dtype`, saved from the CPU."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    spec = CLIP_H14 if size == "real" else CLIP_TINY
    tok = clip_tokenizer()
    config = CLIPConfig(text_config={**spec["text"], "vocab_size": spec["vocab_size"] or len(tok),
                                     "max_position_embeddings": 77},
                        vision_config={**spec["vision"], "patch_size": 14, "image_size": 224},
                        projection_dim=spec["projection_dim"])
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = CLIPModel(config).eval()
    finally:
        torch.set_default_dtype(default)
    model.to("cpu").save_pretrained(str(folder))
    image = CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    CLIPProcessor(image_processor=image, tokenizer=tok).save_pretrained(str(folder))
    return folder
