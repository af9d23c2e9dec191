"""The settings that take one of a few values, and those values: declared here, checked by
schema.Config.validate (an unknown value is named with the closest ones)."""

from __future__ import annotations

from solrl_core.config.families import FAMILIES
from solrl_core.errors import SolrlError, close_matches
from solrl_core.precision.hardware import FP8_BACKENDS, NVFP4_EMULATIONS

SELECTION_MODES = ("best_worst", "random", "mean_deviation", "extremes_random")
EXPLORE_PRECISIONS = ("auto", "nvfp4", "fp8", "nvfp4-emulated", "fp8-e5m2-tensor", "fp8-e5m2-delayed", "bf16", "fp32")
DTYPES = ("auto", "bf16", "fp32")
SOLVERS = ("euler", "dpm2")
GRID_DTYPES = ("fp32", "bf16")
STATE_DTYPES = ("fp32", "run")
SIGMA_GRIDS = ("linspace", "scheduler", "qwen_image")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")  # no CUDA graphs: the copies are refreshed and batches vary
SWITCHES = ("auto", "true", "false")  # a setting solrl decides for this machine unless told
AGGREGATIONS = ("sum", "advantage")
TRACKERS = ("tensorboard", "wandb")
STRATEGIES = ("auto", "replicate", "fsdp")  # distributed.strategy (plan/fsdp.py resolves it, engine/sharding.py shards)
COPY_LAYOUTS = ("auto", "whole", "sharded")  # distributed.copy_layout (sharded_copy.py)
CALIBRATIONS = ("off", "steps", "steps+precision")  # explore.calibrate (calibration.py)
TRAIN_PRECISIONS = ("autocast", "bf16", "fp32-base")
COPY_PLACES = ("auto", "gpu", "cpu-whole", "cpu-blocks")  # memory.copies (offload.py)
LORA_INITS = {"gaussian": "gaussian", "kaiming": True}  # name -> peft's LoraConfig.init_lora_weights
TRAIN_TIMESTEPS = ("subset", "stratified")  # algorithm.train_timesteps (loop/update.py: train_timesteps)
# algorithm.loss (loop/update.py computes each: its _LOSSES), with what `solrl presets` says of it
LOSSES = {"nft": "DiffusionNFT's loss, as Sol-RL trains (the default): --loss nft",
          "awm": "Advantage Weighted Matching: the flow-matching loss weighted by each sample's advantage: --loss awm",
          "flow_grpo": "Flow-GRPO: the clipped ratio of SDE log-probabilities, the trained-on rollouts by its SDE: "
                       "--loss flow_grpo"}
SDE_KINDS = ("sde", "cps")  # algorithm.sde_kind (engine/sde.py)

def choices() -> tuple[tuple[str, tuple], ...]:
    """Each setting that takes one of a few values, with them (checked by schema.Config.validate)."""
    switches = tuple((key, SWITCHES) for key in ("sampler.rollout_copy", "sampler.compile", "explore.compile",
                                                 "optimizer.checkpointing", "optimizer.compile", "memory.vae_on_cpu"))
    return (("algorithm.family", tuple(FAMILIES)), ("selection.mode", SELECTION_MODES),
            ("explore.precision", EXPLORE_PRECISIONS), ("explore.fp8_backend", FP8_BACKENDS),
            ("explore.nvfp4_emulation", NVFP4_EMULATIONS), ("run.dtype", DTYPES), ("sampler.solver", SOLVERS),
            ("sampler.sigma_grid", SIGMA_GRIDS), ("sampler.grid_dtype", GRID_DTYPES),
            ("sampler.state_dtype", STATE_DTYPES), ("sampler.euler_step", STATE_DTYPES),
            ("algorithm.loss_dtype", GRID_DTYPES), ("reward.aggregation", AGGREGATIONS),
            ("run.compile_mode", COMPILE_MODES), ("model.lora_init", tuple(LORA_INITS)),
            ("model.train_precision", TRAIN_PRECISIONS), ("run.stop_on_sigterm", ("phase", "iteration")),
            ("distributed.strategy", STRATEGIES), ("distributed.copy_layout", COPY_LAYOUTS),
            ("explore.calibrate", CALIBRATIONS), ("memory.copies", COPY_PLACES), ("algorithm.loss", tuple(LOSSES)),
            ("algorithm.train_timesteps", TRAIN_TIMESTEPS), ("algorithm.sde_kind", SDE_KINDS),
            *switches)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SolrlError(f"unknown {name} '{value}'", close_matches(value, choices))
