"""Approximate footprints of the real models: download size and an ESTIMATE of peak GPU memory per
process, for `solrl doctor`. Every figure here is approximate and labelled so wherever it is shown;
none is a measurement."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from solrl_core.config import Config

# --- approximate sizes -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSize:
    """APPROXIMATE sizes of a base model, for estimates only (published parameter counts)."""

    label: str
    transformer_b: float  # transformer parameters, billions
    text_encoders_b: float  # all text encoders together, billions
    vae_b: float
    download_gb: float  # the hub download (model_index.json + the subfolders solrl needs, one weight variant)
    activation_gib: float  # training activations per micro-batch sample in bf16, gradient checkpointing on


# By loader; a hub id listed in MODEL_SIZES_BY_HUB_ID overrides its loader's entry.
MODEL_SIZES = {
    "tiny": ModelSize("tiny world model", 0.0013, 0.0, 0.0, 0.0, 0.0),
    "sana": ModelSize("SANA 1.6B + Gemma2-2B text encoder + DC-AE", 1.6, 2.6, 0.32, 12.0, 0.35),
    "flux1": ModelSize("FLUX.1-dev 12B + T5-XXL + CLIP-L", 11.9, 4.9, 0.08, 34.0, 0.9),
    "sd3": ModelSize("SD3.5-Large 8B + T5-XXL + CLIP-L + CLIP-G", 8.1, 5.6, 0.08, 30.0, 1.5),
    "flux2": ModelSize("FLUX.2 [klein] 4B + Qwen3-4B + FLUX.2 VAE", 3.9, 4.0, 0.08, 16.0, 0.3),
    "zimage": ModelSize("Z-Image 6B + Qwen3-4B + FLUX VAE", 6.2, 4.0, 0.08, 21.0, 0.4),
    "qwen_image": ModelSize("Qwen-Image 20B + Qwen2.5-VL-7B + Qwen-Image VAE", 20.4, 8.3, 0.13, 58.0, 1.0),
}
MODEL_SIZES_BY_HUB_ID = {
    "Efficient-Large-Model/Sana_600M_1024px_diffusers":
        ModelSize("SANA 0.6B + Gemma2-2B text encoder + DC-AE", 0.6, 2.6, 0.32, 10.0, 0.2),
    "stabilityai/stable-diffusion-3.5-medium":
        ModelSize("SD3.5-Medium 2.5B + T5-XXL + CLIP-L + CLIP-G", 2.24, 5.6, 0.08, 17.0, 0.3),
}
# Approximate download of each reward's weights, GB.
REWARD_DOWNLOAD_GB = {"imagereward": 1.8, "pickscore": 4.0, "clipscore": 1.7, "hpsv2": 2.0}

# Explore-copy bytes per transformer parameter, by precision; None: the run dtype's own width.
# nvfp4 (Transformer Engine): half a bf16 copy, as the real low-precision weights plus scales and
# TE's work buffers. fp8 and nvfp4-emulated keep the copy's weights at the run dtype (reloaded at each
# refresh) AND a cached quantized weight (quantize.py): 1 byte more per weight for fp8, a second
# copy at the run dtype for the emulation.
COPY_BYTES = {"nvfp4": 1.0, "bf16": 2.0, "fp32": 4.0}
OVERHEAD_GIB = 1.5  # CUDA context, LoRA + AdamW state, one VAE decode chunk, allocator slack


def model_size(cfg: Config) -> ModelSize:
    return MODEL_SIZES_BY_HUB_ID.get(cfg.model.hub_id) or MODEL_SIZES.get(cfg.model.loader) or MODEL_SIZES["sana"]


@dataclass(frozen=True)
class MemoryEstimate:
    """An ESTIMATE of peak GPU memory, GiB, by part (see `estimate_memory`)."""

    policy: float
    explore_copy: float
    vae: float
    text_encoders: float
    activations: float
    overhead: float

    @property
    def peak(self) -> float:
        # The text encoders are on the GPU only while encoding (models/diffusers_models.py), before training.
        return self.policy + self.explore_copy + self.vae + max(self.text_encoders, self.activations) + self.overhead


def estimate_memory(cfg: Config, explore_precision: str, dtype_name: str = "bf16") -> MemoryEstimate:
    """Peak GPU memory ESTIMATE for one process, GiB, from approximate model sizes (`MODEL_SIZES`):

        policy        = transformer params x bytes of the run dtype (the LoRA adapters are negligible)
        explore copy  = transformer params x COPY_BYTES[precision] when the run keeps a rollout copy (an explore
                        precision other than the run dtype, or the compile family's compiled copy);
                        nvfp4-emulated: 2 x the run dtype (weights + cached fake-quantized weights);
                        fp8: the run dtype + 1 byte (weights + cached e4m3 weights)
        vae           = VAE params x bytes of the run dtype
        peak          = policy + explore copy + vae + max(text encoders while encoding, activations) + overhead
        activations   = optimizer.micro_batch x activation GiB per sample (bf16, gradient checkpointing)
    """
    from solrl_core.session import plan_stages

    size = model_size(cfg)
    width = {"bf16": 2.0, "fp32": 4.0}[dtype_name]
    eff = dataclasses.replace(cfg, explore=dataclasses.replace(cfg.explore, precision=explore_precision))
    plan = plan_stages(eff, dtype_name)
    gib = 1e9 / 2**30  # billions of bytes -> GiB
    copy = 0.0
    if plan.explore_precision != dtype_name or plan.compiled:
        per_param = {"nvfp4-emulated": 2 * width, "fp8": width + 1}.get(plan.explore_precision) \
            or COPY_BYTES.get(plan.explore_precision, width)
        copy = size.transformer_b * per_param * gib
    return MemoryEstimate(policy=size.transformer_b * width * gib, explore_copy=copy, vae=size.vae_b * width * gib,
                          text_encoders=size.text_encoders_b * width * gib,
                          activations=cfg.optimizer.micro_batch * size.activation_gib * width / 2, overhead=OVERHEAD_GIB)
