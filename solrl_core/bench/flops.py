"""Model FLOPs: what the transformer computes per sample, and per phase of an iteration.

One forward (a denoising step) and one training pass are counted by torch's FlopCounterMode on a copy
of the transformer on the meta device (no memory, no time): matrix products, convolutions and
attention, 2 FLOPs per multiply-add, the ops FlopCounterMode knows (norms and element-wise ops are
not counted, as usual for MFU). A training pass is what the update does per (sample, timestep):
forward and backward of the policy with its base weights frozen (the backward computes activation
gradients only), plus the old policy's forward, plus the reference's when the KL term is on. The
LoRA adapters' own products (rank 32: a few percent of the projections they sit on) are not counted,
nor are the VAE decode and the rewards: the figure is the transformer's work, which is what the GPU's
peak is for.

`sana_forward_flops` derives one SANA forward from its config alone, as a check on the counter
(tests/test_bench.py); bench/video.py's `wan_forward_flops` does the same for a Wan video model, and
is what a Wan model's forward is counted by here (it equals the counter's figure on the published
models: tests/test_video_bench.py); its training pass is counted by the counter, as every model's.
"""

from __future__ import annotations

from typing import Any

import torch

from solrl_core.bench.build import BenchModel, build_transformer
from solrl_core.bench.video import WAN_TOKENS, per_token_time, wan_forward_flops
from solrl_core.telemetry.model_flops import SampleFlops

SANA_TOKENS = 300  # models/sana.py MAX_SEQUENCE_LENGTH
T5_DEFAULT_TOKENS = {"flux1": 512, "sd3": 256}  # the pipelines' own max_sequence_length, when the preset sets none
CLIP_TOKENS = 77


def text_tokens(loader: str, max_sequence_length: int) -> int:
    """Text tokens the transformer attends to, as solrl encodes prompts (padded, never trimmed)."""
    if loader == "sana":
        return SANA_TOKENS
    if loader == "wan":
        return WAN_TOKENS
    t5 = max_sequence_length or T5_DEFAULT_TOKENS[loader]
    return t5 + (CLIP_TOKENS if loader == "sd3" else 0)


def forward_inputs(model: BenchModel, tokens: int, batch: int, device: torch.device | str,
                   dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """One denoising step's keyword arguments, shaped as solrl's velocity functions call the transformer."""
    c, side = model.transformer, model.latent_side
    kw: dict[str, Any] = dict(device=device, dtype=dtype)
    if model.loader == "wan":  # models/wan.py's wan_velocity and wan22_velocity
        latent = wan_latent(model)
        video = latent[1] * (side // 2) ** 2  # latent frames x 2x2 patches per frame
        return dict(hidden_states=torch.randn(batch, *latent, **kw),
                    timestep=torch.full((batch, video) if per_token_time(model.preset) else (batch,), 500.0,
                                        device=device),
                    encoder_hidden_states=torch.randn(batch, tokens, c["text_dim"], **kw), return_dict=False)
    if model.loader == "sana":
        return dict(hidden_states=torch.randn(batch, c["in_channels"], side, side, **kw),
                    encoder_hidden_states=torch.randn(batch, tokens, c["caption_channels"], **kw),
                    encoder_attention_mask=torch.ones(batch, tokens, device=device, dtype=torch.long),
                    timestep=torch.full((batch,), 500.0, device=device), return_dict=False)
    if model.loader == "flux1":
        image = (side // 2) ** 2  # 2x2 latent patches packed into tokens of in_channels = 4 x latent channels
        return dict(hidden_states=torch.randn(batch, image, c["in_channels"], **kw),
                    timestep=torch.full((batch,), 0.5, **kw),
                    guidance=torch.ones(batch, **kw),
                    pooled_projections=torch.randn(batch, c["pooled_projection_dim"], **kw),
                    encoder_hidden_states=torch.randn(batch, tokens, c["joint_attention_dim"], **kw),
                    txt_ids=torch.zeros(tokens, 3, **kw), img_ids=torch.zeros(image, 3, **kw), return_dict=False)
    return dict(hidden_states=torch.randn(batch, c["in_channels"], side, side, **kw),
                timestep=torch.full((batch,), 500.0, device=device),
                encoder_hidden_states=torch.randn(batch, tokens, c["joint_attention_dim"], **kw),
                pooled_projections=torch.randn(batch, c["pooled_projection_dim"], **kw), return_dict=False)


def wan_latent(model: BenchModel) -> tuple[int, int, int, int]:
    """A Wan model's latent [C, F', H', W'] at the bench's frames and resolution (models/wan.py's shape)."""
    from solrl_core.models.wan import latent_frames

    side = model.latent_side
    return (model.transformer["in_channels"], latent_frames(model.frames, 4), side, side)


def count_sample_flops(model: BenchModel, tokens: int) -> SampleFlops:
    """FlopCounterMode over the transformer on the meta device at batch 1 (FLOPs are linear in the batch);
    a Wan forward by `wan_forward_flops`, which equals the counter's count."""
    from torch.utils.flop_counter import FlopCounterMode

    net = build_transformer(model, "meta").requires_grad_(False)
    if model.loader == "wan":
        forward = wan_forward_flops(model.transformer, wan_latent(model), tokens,
                                    time_per_token=per_token_time(model.preset))
    else:
        with FlopCounterMode(display=False) as counter:
            net(**forward_inputs(model, tokens, 1, "meta"))
        forward = counter.get_total_flops()
    inputs = forward_inputs(model, tokens, 1, "meta")
    inputs["hidden_states"].requires_grad_(True)  # gradients flow back through every block, as to the LoRA layers
    with FlopCounterMode(display=False) as counter:
        net(**inputs)[0].float().sum().backward()
    return SampleFlops(float(forward), float(counter.get_total_flops()))


def sana_forward_flops(config: dict[str, Any], latent_side: int, tokens: int) -> int:
    """One SANA forward at batch 1, derived from the config (diffusers' SanaTransformer2DModel):

        patch embed        2 L Cin D                       L = (side / patch)^2 image tokens, D = heads x head dim
        time embed         2 (256 D + D D + 6 D D)         per sample, not per token
        caption projection 2 T (Cc D + D D)                T text tokens, Cc caption channels
        per block: self-attention q, k, v, out  4 x 2 L D D
                   linear attention (ReLU kernels, value padded with a row of ones): 2 matmuls of 2 (h+1) h L per head
                   cross-attention q, out 2 x 2 L D Dx; k, v 2 x 2 T Dk Dx; scores and values 2 x 2 L T Dx
                   feed-forward (GLUMBConv): 1x1 D -> 2F, 3x3 depthwise on 2F, 1x1 F -> D, F = int(mlp_ratio D)
        output             2 L D (p^2 Cout)
    """
    p = config["patch_size"]
    tokens_img = (latent_side // p) ** 2
    d = config["num_attention_heads"] * config["attention_head_dim"]
    h, heads = config["attention_head_dim"], config["num_attention_heads"]
    dx, dk = config["num_cross_attention_heads"] * config["cross_attention_head_dim"], config["cross_attention_dim"]
    f = int(config["mlp_ratio"] * d)
    L, T = tokens_img, tokens
    outside = (2 * L * config["in_channels"] * p * p * d + 2 * (256 * d + d * d + 6 * d * d)
               + 2 * T * (config["caption_channels"] * d + d * d) + 2 * L * d * p * p * config["out_channels"])
    self_attn = 4 * 2 * L * d * d + heads * 2 * (2 * (h + 1) * h * L)
    cross_attn = 2 * 2 * L * d * dx + 2 * 2 * T * dk * dx + 2 * 2 * L * T * dx
    ff = 2 * L * d * 2 * f + 2 * L * 2 * f * 9 + 2 * L * f * d
    return outside + config["num_layers"] * (self_attn + cross_attn + ff)
