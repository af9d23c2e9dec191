"""The video models in `solrl bench`: the Wan presets' published transformer configurations and the
FLOPs of one Wan forward derived from a config and a latent (latent frames x latent tokens per frame),
checked against torch's FlopCounterMode at the published sizes and against a Wan training run's own
count (tests/test_video_bench.py). The bench does not build or time a Wan model yet; it names the
derived FLOPs per step where it refuses one."""

from __future__ import annotations

from typing import Any

WAN_TOKENS = 512  # WanPipeline.encode_prompt's max_sequence_length, which models/wan.py encodes at (padded)
# The video presets' published transformers (transformer/config.json of Wan-AI/Wan2.1-T2V-1.3B, -14B and
# Wan2.2-TI2V-5B-Diffusers) and their VAEs' spatial compression (4x in time for all three). The bench does not
# time them yet; it derives their FLOPs per denoising step (wan_forward_flops).
_WAN = dict(patch_size=(1, 2, 2), attention_head_dim=128, text_dim=4096, freq_dim=256, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
VIDEO_REAL = {
    "wan21_t2v_1_3b": dict(_WAN, num_attention_heads=12, ffn_dim=8960, num_layers=30, in_channels=16, out_channels=16),
    "wan21_t2v_14b": dict(_WAN, num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=16, out_channels=16),
    "wan22_ti2v_5b": dict(_WAN, num_attention_heads=24, ffn_dim=14336, num_layers=30, in_channels=48, out_channels=48),
}
VIDEO_VAE_FACTOR = {"wan21_t2v_1_3b": 8, "wan21_t2v_14b": 8, "wan22_ti2v_5b": 16}


def wan_forward_flops(config: dict[str, Any], latent_shape: tuple[int, int, int, int], tokens: int = WAN_TOKENS,
                      time_per_token: bool = False) -> int:
    """One Wan forward at batch 1 (diffusers' WanTransformer3DModel), from its config and the latent
    [C, F', H', W'] (F' = 1 + (frames - 1) / 4 latent frames):

        L = (F' / pt) (H' / ph) (W' / pw) video tokens: latent frames x tokens per frame; D = heads x head dim
        patch embed (Conv3d)   2 L (Cin pt ph pw) D
        time embed             2 (256 D + D D + 6 D D) per sample, or per token (Wan 2.2 TI2V: time_per_token)
        text embed             2 T (Ct D + D D)                   T text tokens of width Ct (UMT5: 4096)
        per block: self-attention q, k, v, out  4 x 2 L D D; scores and values 2 x 2 L L D
                   cross-attention q, out 2 x 2 L D D; k, v 2 x 2 T D D; scores and values 2 x 2 L T D
                   feed-forward 2 x 2 L D F
        output                 2 L D (Cout pt ph pw)

    The linear layers grow with L, self-attention with L squared, the text embedding not at all."""
    c, f, h, w = latent_shape
    pt, ph, pw = config["patch_size"]
    L, T = (f // pt) * (h // ph) * (w // pw), tokens
    d = config["num_attention_heads"] * config["attention_head_dim"]
    patch = pt * ph * pw
    time = 2 * (config["freq_dim"] * d + d * d + 6 * d * d) * (L if time_per_token else 1)
    outside = 2 * L * c * patch * d + time + 2 * T * (config["text_dim"] * d + d * d) + 2 * L * d * config["out_channels"] * patch
    self_attn = 4 * 2 * L * d * d + 2 * 2 * L * L * d
    cross_attn = 2 * 2 * L * d * d + 2 * 2 * T * d * d + 2 * 2 * L * T * d
    ff = 2 * 2 * L * d * config["ffn_dim"]
    return outside + config["num_layers"] * (self_attn + cross_attn + ff)


def video_flops_note(preset: str, resolution: int, frames: int | None = None) -> str:
    """For a video preset, its derived FLOPs per denoising step ('' for others): what the bench can say
    of a model it does not time."""
    if preset not in VIDEO_REAL:
        return ""
    from solrl_core.models.wan import latent_frames
    from solrl_core.presets import resolve_config

    frames = frames or resolve_config(preset, "sol_rl").model.frames
    config, side = VIDEO_REAL[preset], resolution // VIDEO_VAE_FACTOR[preset]
    latent = (config["in_channels"], latent_frames(frames, 4), side, side)
    flops = wan_forward_flops(config, latent, time_per_token=preset == "wan22_ti2v_5b")
    return (f" (its forward per denoising step at {resolution} px, {frames} frames: {flops / 1e12:.2f} TFLOP, derived from "
            f"the published config; a training run counts and reports its own)")
