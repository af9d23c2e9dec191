"""The video models in `solrl bench`: the Wan presets' published transformer configurations, the
random-weight WanPipeline the bench builds and times for them, and the FLOPs of one Wan forward derived
from a config and a latent (latent frames x latent tokens per frame), checked against torch's
FlopCounterMode at the published sizes and against a Wan training run's own count
(tests/test_video_bench.py).

What the bench builds for a Wan preset, saved in the hub's WanPipeline layout and loaded by `solrl
train`'s own Wan loader (models/wan.py):

- the transformer (WanTransformer3DModel): the published config at `size="real"`; at `size="tiny"` the
  tests' tiny structure (WAN_TINY: two blocks of width 32) with the real latent channels;
- a one-layer UMT5 text encoder of the real width (text_dim: UMT5-XXL's 4096; tiny: 32). Prompts are
  encoded once and padded to 512 tokens either way, so the transformer sees the real text shape;
- a small AutoencoderKLWan with the real latent channels (16; 48 for Wan 2.2 TI2V) whose compression
  gives the real latent at a reduced pixel size, as the image bench's two-block VAEs do. The released
  Wan VAEs compress 4x in time (the first frame alone, then 4 frames to one latent frame) and 8x in
  space (Wan 2.2: 2x2 pixel patches, then 8x: 16x). Each 4x in time takes two down-sampling levels,
  each of which also halves the space, so the bench's VAE has those two levels: 4x in space and time
  (Wan 2.2: with its 2x2 patches, 8x in space). A clip keeps the preset's frames and is rendered at
  (real latent side) x 4 px (Wan 2.2: x 8):

      wan21_t2v_1_3b, wan21_t2v_14b  256 px, 5 frames -> 16 x 2 x 32 x 32 -> bench 128 px, 5 frames
      wan22_ti2v_5b                  480 px, 5 frames -> 48 x 2 x 30 x 30 -> bench 240 px, 5 frames

  so the transformer, the part the bench measures, sees exactly the real shapes (2 x 16 x 16 = 512 and
  2 x 15 x 15 = 450 video tokens after its 2x2 patches). At tiny size the latent is 8 x 8 per frame.

The FLOPs per sample of a Wan forward are `wan_forward_flops`'s (equal to FlopCounterMode's count on
the published models); the training pass (forward and backward) is counted by FlopCounterMode on the
meta device, as for the image models (flops.py).
"""

from __future__ import annotations

from typing import Any

WAN_TOKENS = 512  # WanPipeline.encode_prompt's max_sequence_length, which models/wan.py encodes at (padded)
# The video presets' published transformers (transformer/config.json of Wan-AI/Wan2.1-T2V-1.3B, -14B and
# Wan2.2-TI2V-5B-Diffusers) and their VAEs' spatial compression (4x in time for all three).
_WAN = dict(patch_size=(1, 2, 2), attention_head_dim=128, text_dim=4096, freq_dim=256, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
VIDEO_REAL = {
    "wan21_t2v_1_3b": dict(_WAN, num_attention_heads=12, ffn_dim=8960, num_layers=30, in_channels=16, out_channels=16),
    "wan21_t2v_14b": dict(_WAN, num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=16, out_channels=16),
    "wan22_ti2v_5b": dict(_WAN, num_attention_heads=24, ffn_dim=14336, num_layers=30, in_channels=48, out_channels=48),
}
VIDEO_VAE_FACTOR = {"wan21_t2v_1_3b": 8, "wan21_t2v_14b": 8, "wan22_ti2v_5b": 16}
# The tiny Wan transformer's structure (diffusers' tests/pipelines/wan/test_wan.py, heads of 16 so every block
# linear is a multiple of 16 wide and the explore copy quantizes it); the tests' tiny pipelines use it too.
WAN_TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, text_dim=32, freq_dim=256,
                ffn_dim=32,
                num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
BENCH_VAE_LEVELS = 2  # the bench VAE's down-sampling levels: 4x in space and time (encoders.wan_vae)
TINY_LATENT_SIDE = 8  # latent pixels per frame side at size "tiny"


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
    outside = 2 * L * c * patch * d + time + 2 * T * (config["text_dim"] * d + d
                                                      * d) + 2 * L * d * config["out_channels"] * patch
    self_attn = 4 * 2 * L * d * d + 2 * 2 * L * L * d
    cross_attn = 2 * 2 * L * d * d + 2 * 2 * T * d * d + 2 * 2 * L * T * d
    ff = 2 * 2 * L * d * config["ffn_dim"]
    return outside + config["num_layers"] * (self_attn + cross_attn + ff)


def latent_channels(preset: str) -> int:
    """The preset's latent channels (16; Wan 2.2 TI2V 48); a Wan preset with no published config recorded
    is built with Wan 2.1's structure."""
    return VIDEO_REAL.get(preset, VIDEO_REAL["wan21_t2v_1_3b"])["in_channels"]


def per_token_time(preset: str) -> bool:
    """Wan 2.2 TI2V's 48-channel layout takes one timestep per latent token (WanPipeline's expand_timesteps)."""
    return latent_channels(preset) == 48


def bench_vae_factor(preset: str) -> int:
    """The bench VAE's spatial compression: 2^levels, times Wan 2.2's 2x2 pixel patches."""
    return 2 ** BENCH_VAE_LEVELS * (2 if per_token_time(preset) else 1)


def wan_transformer_config(preset: str, size: str) -> dict[str, Any]:
    """The published config (`size` "real"; the preset must be recorded) or the tiny one of its structure."""
    if size == "real":
        return VIDEO_REAL[preset]
    return dict(WAN_TINY, in_channels=latent_channels(preset), out_channels=latent_channels(preset))


def wan_bench_resolution(preset: str, resolution: int, size: str) -> int:
    """The pixel size the bench renders at: the real latent side (`resolution` over the released VAE's
    compression; tiny: TINY_LATENT_SIDE) times the bench VAE's compression."""
    side = TINY_LATENT_SIDE if size == "tiny" else resolution // VIDEO_VAE_FACTOR[preset]
    return side * bench_vae_factor(preset)


def wan_parts(preset: str, size: str, resolution: int) -> str:
    """What is built beside the transformer, for the bench's progress line."""
    factor = bench_vae_factor(preset)
    return (f"a one-layer UMT5 text encoder of {'the real width' if size == 'real' else 'tiny width'} "
            f"({wan_transformer_config(preset, size)['text_dim']}) and a small Wan VAE ({factor}x in space, 4x in "
            f"time: the {'real ' if size == 'real' else ''}latent at {resolution} px)")


def wan_pipeline(transformer: Any, vae: Any, text_encoder: Any, tokenizer: Any, expand_timesteps: bool) -> Any:
    """A WanPipeline of these parts with the scheduler its hub folder ships (UniPC with flow sigmas, shift
    3, for Wan 2.1; flow-matching Euler, shift 5, with per-token timesteps for Wan 2.2 TI2V). solrl
    samples with its own sampler; the scheduler only completes the layout."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline

    if expand_timesteps:
        return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                           scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), expand_timesteps=True)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=scheduler)


def bench_wan_pipeline(preset: str, transformer: Any) -> Any:
    """The bench's WanPipeline around `transformer`: a one-layer UMT5 of its text width and the small
    Wan VAE of its latent channels (module docstring)."""
    from solrl_core.bench import encoders as enc

    tokenizer = enc.t5_tokenizer()
    ti2v = per_token_time(preset)
    vae = enc.wan_vae(transformer.config.in_channels, BENCH_VAE_LEVELS, patch=2 if ti2v else 1)
    return wan_pipeline(transformer, vae, enc.umt5_encoder(tokenizer, transformer.config.text_dim), tokenizer, ti2v)
