"""Approximate footprints of the real models: download size and an ESTIMATE of peak GPU memory per
process, for `solrl doctor`. Every figure here is approximate and labelled so wherever it is shown;
none is a measurement."""

from __future__ import annotations

from dataclasses import dataclass, replace

from solrl_core.config.schema import Config
from solrl_core.plan.plan import MemoryModes, plan_stages

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
    activation_full_gib: float = 0.0  # the same without gradient checkpointing
    adapter_m: float = 0.0  # LoRA parameters of the preset's targets at rank 32, millions (ADAPTERS_M)


# By loader; a hub id listed in MODEL_SIZES_BY_HUB_ID overrides its loader's entry.
# activation_full_gib: SANA's from one H100 measurement (forward+backward at micro-batch 16, fp32 LoRA under
# bf16 autocast: 62.2 GiB peak without checkpointing, 10.9 GiB with, so about 3.2 GiB more per sample);
# every other model's scaled from its checkpointed figure by the same ratio (about 10x): APPROXIMATE.
MODEL_SIZES = {
    "tiny": ModelSize("tiny world model", 0.0013, 0.0, 0.0, 0.0, 0.0, 0.0),
    "tiny_video": ModelSize("tiny moving world model", 0.0010, 0.0, 0.0, 0.0, 0.0, 0.0),
    "sana": ModelSize("SANA 1.6B + Gemma2-2B text encoder + DC-AE", 1.6, 2.6, 0.32, 12.0, 0.35, 3.55),
    "flux1": ModelSize("FLUX.1-dev 12B + T5-XXL + CLIP-L", 11.9, 4.9, 0.08, 34.0, 0.9, 9.1),
    "sd3": ModelSize("SD3.5-Large 8B + T5-XXL + CLIP-L + CLIP-G", 8.1, 5.6, 0.08, 30.0, 1.5, 15.2),
    "flux2": ModelSize("FLUX.2 [klein] 4B + Qwen3-4B + FLUX.2 VAE", 3.9, 4.0, 0.08, 16.0, 0.3, 3.0),
    "zimage": ModelSize("Z-Image 6B + Qwen3-4B + FLUX VAE", 6.2, 4.0, 0.08, 21.0, 0.4, 4.0),
    "qwen_image": ModelSize("Qwen-Image 20B + Qwen2.5-VL-7B + Qwen-Image VAE", 20.4, 8.3, 0.13, 58.0, 1.0, 10.1),
    # Wan 2.1 T2V 1.3B: parameters of the published configs (transformer 1.42B, UMT5-XXL encoder 5.7B,
    # VAE 0.13B); the download is an estimate of their weights' files; activations scaled from SANA's by
    # tokens (a 256px 5-frame clip is 512 tokens, SANA's 1024px image 1024): APPROXIMATE, unmeasured.
    "wan": ModelSize("Wan 2.1 T2V 1.3B + UMT5-XXL + Wan VAE", 1.42, 5.7, 0.13, 29.0, 0.2, 1.8),
}
MODEL_SIZES_BY_HUB_ID = {
    "Efficient-Large-Model/Sana_600M_1024px_diffusers":
        ModelSize("SANA 0.6B + Gemma2-2B text encoder + DC-AE", 0.6, 2.6, 0.32, 10.0, 0.2, 2.0),
    "stabilityai/stable-diffusion-3.5-medium":
        ModelSize("SD3.5-Medium 2.5B + T5-XXL + CLIP-L + CLIP-G", 2.24, 5.6, 0.08, 17.0, 0.3, 3.0),
    # The 14B transformer (14.29B parameters, tests/test_wan.py) with the 1.3B's encoder and VAE; activations
    # the 1.3B's scaled by width x depth (5120 x 40 against 1536 x 30): APPROXIMATE, unmeasured.
    "Wan-AI/Wan2.1-T2V-14B-Diffusers": ModelSize("Wan 2.1 T2V 14B + UMT5-XXL + Wan VAE", 14.29, 5.7, 0.13, 80.0, 0.9,
                                                 8.0),
    # The 5.00B transformer (tests/test_wan.py), the same encoder, the Wan 2.2 VAE (size an estimate); activations
    # the 1.3B's scaled by width (3072 against 1536) at about the same tokens: APPROXIMATE, unmeasured.
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": ModelSize("Wan 2.2 TI2V 5B + UMT5-XXL + Wan 2.2 VAE", 5.0, 5.7, 0.7, 34.0, 0.4,
                                                 3.6),
}
# A reward's download and memory are declared with the reward (rewards/registry.py).

# LoRA parameters at rank 32 on each preset's targets, millions: r x (in + out) summed over the adapted
# layers, from the published widths and depths (SANA 1.6B: 20 blocks x 8 projections of 2240; SANA 0.6B:
# 28 x 8 of 1152; FLUX.1: 19 x 4 + 38 x 3 of 3072; SD3.5-L: 38 x 8 of 2432 less the last block's
# to_add_out; SD3.5-M: 24 x 8 of 1536; Qwen-Image: 60 x 8 of 3072; Z-Image: 30 x 4 of 3840; Wan 1.3B:
# 30 x 8 of 1536; Wan 14B: 40 x 8 of 5120; Wan 2.2 5B: 30 x 8 of 3072); FLUX.2 [klein] scaled from FLUX.1
# by parameters. DERIVED, not counted on the models; scaled by model.lora_rank / 32.
ADAPTERS_M = {"sana": 22.9, "flux1": 37.4, "sd3": 47.2, "flux2": 12.3, "zimage": 29.5, "qwen_image": 94.4, "wan": 23.6,
              "Efficient-Large-Model/Sana_600M_1024px_diffusers": 16.5, "stabilityai/stable-diffusion-3.5-medium": 18.9,
              "Wan-AI/Wan2.1-T2V-14B-Diffusers": 104.9, "Wan-AI/Wan2.2-TI2V-5B-Diffusers": 47.2}
ADAMW_BYTES = 8.0  # AdamW's moments, bytes per adapter parameter: two fp32 tensors
# cpu-blocks: the share of a copy on the GPU at once, one block and the root's layers (SANA has 20
# blocks, FLUX.1 57, SD3.5-L 38): an APPROXIMATE upper share, as fsdp.GATHERED_SHARE.
BLOCK_SHARE = 0.1


# Explore-copy bytes per transformer parameter, by precision; None: the run dtype's own width.
# nvfp4 (Transformer Engine): half a bf16 copy, as the real low-precision weights plus scales and
# TE's work buffers. fp8 and the emulations (quantize.py) keep only each quantized layer's cached
# quantized weight (engine._copy: a lean copy), not its high-precision weight: 1 byte a weight for
# fp8, the run dtype's width for the emulations (their fake-quantized weights are stored at it).
COPY_BYTES = {"nvfp4": 1.0, "bf16": 2.0, "fp32": 4.0}
# CUDA context, LoRA + AdamW state (split out as MemoryEstimate.optimizer), one VAE decode chunk, slack
OVERHEAD_GIB = 1.5
# Training activations of a torch.compile'd update (optimizer.compile, regions.py) over eager ones,
# without checkpointing: SANA-1.6B at micro-batch 16 on an H100 peaked at 55.97 GiB (sol_rl) and
# 52.02 GiB (compile family) with the update compiled, about 2.8 GiB a sample where the eager
# update took 3.55 (docs/BENCHMARKS.md, 2026-11-24). One model measured: APPROXIMATE for the others.
COMPILED_ACTIVATION_SHARE = 0.79
FIT_SHARE = 0.9  # of a GPU's memory the estimate may use: the rest is the allocator's and the estimate's slack


def copy_bytes(precision: str, width: float) -> float:
    """Explore-copy bytes per transformer parameter at `precision` in a run of `width` bytes: the
    cached quantized weights (fp8: 1 byte; the emulations: the run dtype), the layers the rule keeps
    at the run dtype and fp8's row scales left out (APPROXIMATE)."""
    return {"nvfp4-emulated": width, "fp8-e5m2-tensor": width, "fp8-e5m2-delayed": width,
            "fp8": 1.0}.get(precision) or COPY_BYTES.get(precision, width)


def model_size(cfg: Config) -> ModelSize:
    size = MODEL_SIZES_BY_HUB_ID.get(cfg.model.hub_id) or MODEL_SIZES.get(cfg.model.loader) or MODEL_SIZES["sana"]
    adapters = ADAPTERS_M.get(cfg.model.hub_id) or ADAPTERS_M.get(cfg.model.loader, 0.0)
    return replace(size, adapter_m=adapters * cfg.model.lora_rank / 32)


@dataclass(frozen=True)
class MemoryEstimate:
    """An ESTIMATE of peak GPU memory, GiB, by part (see `estimate_memory`)."""

    policy: float
    explore_copy: float
    vae: float
    text_encoders: float
    activations: float
    overhead: float
    rollout_copy: float = 0.0  # counted in the peak only when the run keeps one
    rollout_copy_size: float = 0.0  # what a full-precision rollout copy would take, kept or not
    optimizer: float = 0.0  # AdamW's moments (part of OVERHEAD_GIB in fp32: `overhead` is the rest)
    modes: MemoryModes = MemoryModes()

    @property
    def peak(self) -> float:
        """The largest phase: what stays on the GPU, plus the largest of encoding (the text encoders visit
        only then: models/diffusers_models.py), the update (activations, and v_old's copy where it moves
        in), Stage 1 and Stage 2 (a copy moved in, and a VAE on the CPU moved in to decode)."""
        m = self.modes
        share = {"gpu": 0.0, "cpu-whole": 1.0, "cpu-blocks": BLOCK_SHARE}[m.copies]
        resident = self.policy + self.overhead + self.optimizer + (0.0 if m.vae_on_cpu else self.vae)
        if m.copies == "gpu":
            resident += self.explore_copy + self.rollout_copy
        decode = self.vae if m.vae_on_cpu else 0.0
        phases = (self.text_encoders, self.activations + self.rollout_copy * share,
                  self.explore_copy * share + decode, self.rollout_copy * share + decode)
        return resident + max(phases)


def estimate_memory(cfg: Config, explore_precision: str, dtype_name: str = "bf16", checkpointing: bool = True,
                    rollout_copy: bool = False, compiled_update: bool = False,
                    modes: MemoryModes | None = None) -> MemoryEstimate:
    """Peak GPU memory ESTIMATE for one process, GiB, from approximate model sizes (`MODEL_SIZES`);
    `explore_precision` is the resolved one (see resolve.py):

        policy        = transformer params x bytes of the run dtype (4 with model.train_precision = fp32-base;
                        the LoRA adapters are negligible)
        explore copy  = transformer params x `copy_bytes(precision)` when the family explores at a precision
                        other than the run dtype: the cached quantized weights alone (a lean copy, engine._copy)
        rollout copy  = transformer params x bytes of the run dtype, when kept (sampler.rollout_copy)
        vae           = VAE params x bytes of the run dtype
        activations   = optimizer.micro_batch x activation GiB per sample (bf16; with or without checkpointing;
                        without it and with a compiled update, x COMPILED_ACTIVATION_SHARE)
        optimizer     = LoRA parameters (ADAPTERS_M) x ADAMW_BYTES (two fp32 moments)
        peak          = policy + copies + vae + max(text encoders while encoding, activations) + overhead, with
                        the memory `modes` (MemoryEstimate.peak): copies and VAE on the CPU count only in the
                        phase they are moved in for; `checkpointing` in `modes` overrides the argument
    """
    if modes is not None:
        checkpointing = modes.checkpointing
    size = model_size(cfg)
    width = {"bf16": 2.0, "fp32": 4.0}[dtype_name]
    plan = plan_stages(cfg, dtype_name, explore_precision)
    gib = 1e9 / 2**30  # billions of bytes -> GiB
    copy = 0.0
    if plan.explore_precision != dtype_name:
        copy = size.transformer_b * copy_bytes(plan.explore_precision, width) * gib
    per_sample = size.activation_gib if checkpointing else size.activation_full_gib
    if compiled_update and not checkpointing:
        per_sample *= COMPILED_ACTIVATION_SHARE
    full_copy = size.transformer_b * width * gib
    base = 4.0 if cfg.model.train_precision == "fp32-base" else width  # an fp32 policy base under a bf16 run
    modes = modes or MemoryModes(checkpointing=checkpointing)
    moments = size.adapter_m * 1e6 / 2**30  # GiB per byte per adapter parameter
    return MemoryEstimate(policy=size.transformer_b * base * gib, explore_copy=copy, vae=size.vae_b * width * gib,
                          text_encoders=size.text_encoders_b * width * gib,
                          activations=cfg.optimizer.micro_batch * per_sample * width / 2,
                          overhead=OVERHEAD_GIB - moments * ADAMW_BYTES,
                          rollout_copy=full_copy if rollout_copy else 0.0, rollout_copy_size=full_copy,
                          optimizer=moments * ADAMW_BYTES, modes=modes)
