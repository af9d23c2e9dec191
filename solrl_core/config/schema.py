"""Typed, frozen run configuration.

A config is built in layers, each overriding the last: dataclass defaults (the official Sol-RL
defaults for an 8-GPU node) < model preset < family preset < reward preset < `--config FILE` <
`--set section.key=value` < explicit CLI flags. `resolve_config` (presets.py) layers; here the schema, whose
`help` metadata `solrl config-help` shows, and the cross-field rules (`validate`); config_io.py (de)serialises.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from solrl_core.config.bounds import check_hacking, check_loss_settings, check_ranges
from solrl_core.config.choices import TRACKERS, check_choice, choices
from solrl_core.config.families import FAMILIES
from solrl_core.config.loaders import T5_LOADERS, TINY_LOADERS, VIDEO_LOADERS, check_frames, check_model_path
from solrl_core.errors import SolrlError
from solrl_core.rewards.endpoints import check_settings
from solrl_core.rewards.names import check_names
from solrl_core.rewards.timeouts import parse_timeout

def _f(default: Any, help: str) -> Any:
    """A dataclass field whose help text travels with it."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ModelConfig:
    name: str = _f("tiny", "Model preset name (informational; the loader decides what is built).")
    loader: str = _f("tiny", "Which loader builds the model: tiny, tiny_video (video), sana, flux1, sd3, qwen_image, "
                             "zimage, flux2, wan (video).")
    hub_id: str = _f("", "Hugging Face hub id of the base model.")
    path: str = _f("", "Local folder with the base model; used instead of hub_id when set.")
    weights: str = _f("", "Weights folder of the tiny and tiny_video models ('' = random init from init_seed).")
    init_seed: int = _f(0, "Seed of the random init when no weights are given.")
    resolution: int = _f(1024, "Image side in pixels.")
    frames: int = _f(0, "Frames per clip of a video model (the wan loader: 1 + a multiple of 4; tiny_video: 4); 0 = an "
                        "image model.")
    lora_rank: int = _f(32, "LoRA rank r.")
    lora_alpha: int = _f(64, "LoRA alpha (scale = alpha / r).")
    lora_init: str = _f("gaussian", "How each adapter's A matrix starts (B is zero, so the adapted model starts equal "
                                    "to the base): gaussian (normal, std 1/r: peft's 'gaussian', set by every official "
                                    "Sol-RL config: NVlabs/Sana 4b72423 configs/sol_rl/sana.py:32, flux1.py:22, "
                                    "sd3.py:29) or kaiming (peft's default Kaiming-uniform, std 1/sqrt(3 * "
                                    "in_features): a third of gaussian's at FLUX.1's width 3072 and r=32).")
    train_precision: str = _f("autocast", "How the policy runs when the run dtype is bf16 (fp32 runs are fp32 "
                                          "throughout); the adapters are fp32 in all: autocast (bf16 base, its "
                                          "forwards under bf16 autocast: the official FLUX.1 regime, train_flux1.py), "
                                          "bf16 (bf16 base, no autocast: peft runs each adapter in fp32 and adds it to "
                                          "the bf16 output; the official SANA regime, train_sana.py), fp32-base (the "
                                          "policy's base in fp32 under bf16 autocast, its rollout copies bf16: the "
                                          "official SD3 regime, train_sd3.py:550; twice the policy's memory). The loss "
                                          "is fp32 in all.")
    lora_targets: tuple[str, ...] = _f(
        ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
         "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"),
        "Module-name suffixes that get LoRA adapters.",
    )
    quant_skip: tuple[str,
            ...] = _f(("patch_embed", "time_embed", "caption_projection", "caption_norm", "proj_out", "norm_out"),
                                     "Module-name substrings never quantized in the explore copy (embedders, final "
                                     "layer).")
    quant_min_dim: int = _f(0, "Layers with max(in, out) <= this stay in high precision in the explore copy (the "
                               "official nvfp4_min_dim: SANA 2240, SD3.5-L 2432, FLUX.1 1000); 0 = no size rule.")
    quant_fused: tuple[str, ...] = _f((), "Groups of sibling projections the official model holds as one fused layer, "
                                          "as 'a+b' suffixes (SANA: attn2.to_k+attn2.to_v is cross_attn.kv_linear): "
                                          "the size rule sees the group's summed output width.")
    max_sequence_length: int = _f(0, "T5 tokens each prompt is encoded to (flux1 and sd3 loaders; neither masks the "
                                     "padding, so it changes every velocity): 0 = the pipeline's own default "
                                     "(FluxPipeline 512, StableDiffusion3Pipeline 256). The official Sol-RL scripts "
                                     "use 128 (train_flux1.py, train_sd3.py: TEXT_ENCODER_MAX_SEQ_LEN), which the "
                                     "flux1 and sd3 presets set.")
    prompt_instruction: bool = _f(False, "SANA: prefix prompts with SanaPipeline's complex human instruction "
                                         "(diffusers' default); the official Sol-RL code encodes prompts without it.")


@dataclass(frozen=True)
class SamplerConfig:
    steps: int = _f(10, "Full rollout steps (Stage 2, and every rollout of the non-explore families).")
    solver: str = _f("euler", "ODE solver on the sigma grid: euler, or dpm2 (DPM-Solver++(2M), the official SD3/FLUX "
                              "sampler).")
    shift: float = _f(1.0, "Sigma shift s: sigma' = s*sigma / (1 + (s-1)*sigma); 1.0 = plain linspace(1, 0).")
    sigma_grid: str = _f("linspace", "How the sigma grid is built: linspace (linspace(1, 1/n) then shifted: the SANA "
                                     "and FLUX pipelines) or scheduler (FlowMatchEulerDiscreteScheduler.set_timesteps "
                                     "with a static shift, whose last sigma is shift(shift(1/1000)): the SD3/3.5 "
                                     "pipelines) or qwen_image (linspace, shifted, stretched to end at 0.02: the "
                                     "Qwen-Image pipeline).")
    grid_dtype: str = _f("fp32", "The sigma grid's dtype: fp32, or bf16 (each sigma rounded to bf16, as the official "
                                 "SANA pipeline builds its grid in the latents' dtype: 0.8984, 0.8008, ..., 0.1001). "
                                 "Rollouts, the trained sigmas and the timesteps all follow it.")
    state_dtype: str = _f("fp32", "dpm2's latent state between steps: fp32, or run (rounded to the run dtype after "
                                  "every step, as diffusers' scheduler in the official SD3/FLUX rollouts). Euler keeps "
                                  "the state in the run dtype either way, as the official SANA sampler.")
    euler_step: str = _f("fp32", "How an Euler step x + dt * v is computed in a bf16 run: fp32 (from the bf16 state "
                                 "and velocity, rounded once to bf16: the official run_sampling, which hands "
                                 "flow_grpo_step pred.float() and z.float()) or run (the product and the sum each "
                                 "rounded to bf16: solrl before this setting). The same in an fp32 run (a CPU's "
                                 "default).")
    integer_timesteps: bool = _f(False, "Rollouts hand the model whole-number timesteps, trunc(sigma x 1000), as the "
                                        "official SD3 pipeline (dtype=torch.long); the solver steps and training keep "
                                        "the grid's.")
    guidance: float = _f(1.0, "Classifier-free guidance scale; 1.0 = CFG off (the official setting).")
    rollout_batch: int = _f(24, "Samples generated per forward batch.")
    rollout_copy: str = _f("auto", "Full-precision rollouts (Stage 2, the full-precision families, the rank check) and "
                                   "the update's v_old on a separate copy of base + old adapter merged, refreshed "
                                   "after each step, as the official code does: auto (when the memory estimate says it "
                                   "fits), true, false (the policy with its old adapter active: one copy of the "
                                   "model). Under distributed.strategy=fsdp the copy is sharded like the policy and "
                                   "auto keeps it where the estimate fits the GPU (none on a CPU).")
    compile: str = _f("auto", "torch.compile the full-precision rollout copy: auto (on CUDA), true, false. Compiled "
                              "bf16 is the official baseline; naive_scaling with compile=false is the eager one.")
    eval_steps: int = _f(40, "Steps of evaluation rollouts (official: 40 SANA/SD3, 28 FLUX).")


@dataclass(frozen=True)
class ExploreConfig:
    group_size: int = _f(96, "N: seeds explored per prompt in Stage 1.")
    steps: int = _f(6, "Preview steps of the Stage-1 rollout (sol_rl).")
    precision: str = _f("auto", "Explore precision: auto (nvfp4 on compute capability >= 10.0, its speed unmeasured; "
                                "fp8 on >= 8.9; else the run dtype; on a CPU the exact NVFP4 emulation), nvfp4 (real "
                                "NVFP4 GEMMs through torchao), fp8 (real E4M3 GEMMs), nvfp4-emulated, fp8-e5m2-tensor "
                                "(per-tensor E5M2 at each tensor's own amax), fp8-e5m2-delayed (the official recipe: "
                                "TE's delayed-scaled E5M2), bf16, fp32.")
    fp8_backend: str = _f("scaled_mm", "The kernel of explore.precision=fp8: scaled_mm (solrl's torch._scaled_mm "
                                       "wrapper, timed on an H100) or torchao (Float8 dynamic activation + weight, "
                                       "PerRow; unmeasured).")
    nvfp4_emulation: str = _f("exact", "nvfp4-emulated's GEMM: exact (each value dequantized, then the GEMM) or "
                                       "torchao (the real nvfp4 kernel's order: output in the run dtype times the "
                                       "per-tensor scale product rounded to it; bit for bit).")
    fp8_attention: bool = _f(False, "FP8 attention in the explore copy of a full-attention model (E4M3 Q/K/V, one "
                                    "scale per batch and head): torchao's FP8 FA3 on Hopper, emulated on a CPU. Off by "
                                    "default: unmeasured; solrl rank-check reports it on and off.")
    compile: str = _f("auto", "torch.compile the explore copy (auto: on CUDA; true; false): fuses the fp8 / "
                              "emulated-NVFP4 input quantization into the neighbouring kernels; compiles once at start "
                              "and keeps the graph across refreshes. An fp8 copy on CUDA is compiled even at false: "
                              "eager fp8 is slower than eager bf16 there.")
    rank_check_every: int = _f(0, "Every this many iterations, regenerate all N Stage-1 seeds of the iteration's first "
                                  "prompt at full precision and full steps, and log Spearman rho and Kendall tau (0 = "
                                  "off).")
    calibrate: str = _f("off", "How Stage 1's preview steps are set: off (explore.steps, fixed), steps (auto: before "
                               "the first iteration and every explore.recalibrate_every, roll the same seeds of a few "
                               "of the iteration's prompts out at full precision and full steps and at every preview "
                               "step count from 2 to sampler.steps (to explore.steps with the auto floor), and take "
                               "the cheapest, by seconds measured on this machine, whose best_worst selection recovers "
                               "the full-precision one's at explore.min_recall; calibration.py), or steps+precision "
                               "(the same over every low explore precision this machine runs too, each on an explore "
                               "copy built for the calibration; the chosen one becomes the explore copy). The choice "
                               "is said at start and in a CalibrationDone event, and kept in the checkpoint.")
    recalibrate_every: int = _f(0, "With explore.calibrate (steps or steps+precision): calibrate again every this many "
                                   "iterations (0 = once, at start).")
    min_recall: float = _f(0.0, "With explore.calibrate: the share of the full-precision selection's K seeds a preview "
                                "setting must also pick. 0 = auto: what explore.steps at the run's explore precision "
                                "reaches in the same calibration, less its standard error over the calibration's "
                                "prompts.")
    calibrate_prompts: int = _f(2, "With explore.calibrate: prompt groups of the iteration each calibration measures "
                                   "(N seeds each), on rank 0.")


@dataclass(frozen=True)
class SelectionConfig:
    group_size: int = _f(24, "K: seeds per prompt kept for training (even; K/2 best and K/2 worst).")
    mode: str = _f("best_worst", "How K of N are kept: best_worst, random, mean_deviation, extremes_random.")


@dataclass(frozen=True)
class AlgorithmConfig:
    family: str = _f("sol_rl", "sol_rl, naive_scaling, compile, naive_quant or diffusionnft.")
    loss: str = _f("nft", "The update's loss: nft (DiffusionNFT's, as Sol-RL trains), awm (Advantage Weighted "
                          "Matching: the flow-matching loss weighted by each sample's advantage) or flow_grpo (the "
                          "clipped ratio of SDE log-probabilities; its trained-on rollouts take the SDE sampler). "
                          "docs/official-settings.md, 'AWM' and 'Flow-GRPO'. Every family trains with each.")
    nft_beta: float = _f(1.0,
                         "DiffusionNFT mixing beta of the implicit positive/negative policies (not the KL weight).")
    kl_beta: float = _f(1e-4, "Weight of the KL-like penalty mean((v - v_ref)^2) (not the NFT beta).")
    adv_clip_max: float = _f(5.0, "Advantages are clipped to [-adv_clip_max, adv_clip_max].")
    timestep_fraction: float = _f(0.6, "Share of the rollout sigma grid trained per sample.")
    train_timesteps: str = _f("subset", "Each sample's train timesteps, from its own generator: subset (a random "
                                        "int(sampler.steps * timestep_fraction) of the grid, DiffusionNFT's) or "
                                        "stratified (AWM's 'discrete': one in each of algorithm.strata equal strata of "
                                        "the first int(sampler.steps * timestep_fraction) grid steps).")
    strata: int = _f(6, "train_timesteps=stratified: how many timesteps per sample (AWM's train_timesteps, "
                        "config/dgx_awm.py:334).")
    old_decay_rate: float = _f(0.001, "Old-policy decay d = min(rate * step, max).")
    old_decay_max: float = _f(0.5, "Upper bound of the old-policy decay.")
    ema_max_decay: float = _f(0.9, "EMA decay min((1+s)/(10+s), max) of the evaluation weights.")
    awm_power: float = _f(0.25, "awm: power p of the generalised-Huber weighting ((mse + 1e-10)^p - 1e-10^p) t / p "
                                "(the reference's ghuber_power: config/dgx_awm.py:64).")
    awm_anchor_beta: float = _f(1.0, "awm: weight of mean((v - v_old)^2), the pull toward the old adapter (the "
                                     "reference's ema_beta: config/dgx_awm.py:345); added only when kl_beta > 0, as "
                                     "the reference nests it (scripts/train_sd3_awm.py:1330-1354).")
    sde_eta: float = _f(0.7, "flow_grpo: the SDE sampler's noise level (the reference's sample.noise_level, "
                             "config/base.py:61; 0.9 in its FLUX.1 configs).")
    sde_kind: str = _f("sde", "flow_grpo: the SDE step, sde (Flow-GRPO's) or cps (coefficients-preserving).")
    sde_window: int = _f(0, "flow_grpo: 0, the SDE at every step; W, Flow-GRPO-Fast's window: the SDE at W steps "
                            "from a random one of the first half (the ODE elsewhere), and those W trained.")
    clip_range: float = _f(1e-4, "flow_grpo: the ratio's clip, [1 - c, 1 + c] (the reference's train.clip_range, "
                                 "config/base.py:99).")
    loss_dtype: str = _f("fp32", "The update's inputs (sigma, training noise, xt): fp32, or bf16 (each rounded to bf16 "
                                 "before the forwards and the loss, as the official SANA and FLUX.1 scripts build "
                                 "them).")


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = _f(3e-4, "AdamW learning rate (LoRA parameters only).")
    beta1: float = _f(0.9, "AdamW beta1.")
    beta2: float = _f(0.999, "AdamW beta2.")
    weight_decay: float = _f(1e-4, "AdamW weight decay.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    grad_clip: float = _f(1.0, "Gradient-norm clip; 0 disables.")
    micro_batch: int = _f(16, "Training micro-batch (samples per forward/backward).")
    checkpointing: str = _f("auto", "Gradient checkpointing of the trained forward: auto (on CUDA when the memory "
                                    "estimate without it does not fit this GPU; off on a CPU), true, false.")
    compile: str = _f("auto", "torch.compile the policy's forwards in the update (the trained forward and its "
                              "backward, the reference forward, and v_old when there is no rollout copy): auto (on "
                              "CUDA), true, false. One compiled module; each adapter state is its own graph, compiled "
                              "before iteration 1.")
    steps_per_iteration: int = _f(1, "Optimizer steps per iteration, each on its share of the iteration's samples "
                                      "(each process's, in order): 2 is Flow-GRPO's (config/grpo.py:98).")
    max_nonfinite_steps: int = _f(5, "Stop the run after this many optimizer steps in a row were skipped because the "
                                     "loss or gradient norm was NaN or infinite (each such step is skipped; 0 = never "
                                     "stop).")


@dataclass(frozen=True)
class RewardConfig:
    weights: dict[str, float] = _f({"jpeg_compressibility": 1.0}, "Reward name -> weight.")
    aggregation: str = _f("sum", "sum: advantage of the weighted sum of raw rewards; advantage: each reward's own "
                                 "group advantage, then the weighted sum (robust to rewards on different scales).")
    paths: dict[str, str] = _f({}, "Reward name -> local folder (or file) with its weights; unset = hub id / HF cache.")
    batch_size: int = _f(32, "Images per forward pass of a model reward.")
    video_frames: int = _f(0, "Video models: frames of each clip an image reward scores, evenly spaced from the first "
                              "to the last (0 = every frame, as Flow-Factory's image rewards score a video: "
                              "rewards/pick_score.py _compute_video_scores).")
    frame_reduce: str = _f("mean", "Video models: how an image reward's frame scores make the clip's score: mean "
                                   "(Flow-Factory's) or min (the worst frame).")
    health_min_std: float = _f(1e-6, "A reward whose std over the batch, or within every prompt group, is at most this "
                                     "is near-constant (a failed load or broken preprocessing): warned about.")
    health_patience: int = _f(3, "Stop the run after this many consecutive near-constant iterations of one reward, or "
                                 "iterations where it scored every image NaN or infinite (0 = never).")
    timeout_s: str = _f("auto", "Seconds one reward may take to score one batch before the run stops with a checkpoint "
                                "(a hung reward model or server). auto: 600 for the model rewards (imagereward, "
                                "pickscore, clipscore, hpsv2), URL rewards and reward plugins, none for the built-in "
                                "programmatic ones (jpeg_*, tinyworld_geneval); a number sets it for every reward; 0 "
                                "turns the watchdog off.")
    retries: int = _f(1, "Times a reward whose scoring raises is called again before the run stops with a checkpoint "
                         "(0 = stop at the first error). An out-of-memory error is never retried: it halves "
                         "reward.batch_size.")
    remote: dict[str, str] = _f({}, "Settings of remote:URL and vlm:URL rewards (docs/rewards.md): encoding (uint8, "
                                    "png, float32) and on_change (refuse, warn: a server serving another reward on "
                                    "--resume) for remote:; judge, model, template, scoring, scale, concurrency, "
                                    "max_tokens for vlm:.")


@dataclass(frozen=True)
class RunConfig:
    iterations: int = _f(300, "Training iterations (one optimizer step each).")
    prompts_per_iteration: int = _f(48, "Prompt groups per iteration.")
    prompts: str = _f("general", "Prompt set (docs/prompts.md): a name (solrl presets), a file or save_to_disk folder, "
                                 "or hf:OWNER/NAME.")
    seed: int = _f(0, "Run seed: prompts, noise seeds, timesteps and training noise derive from it.")
    run_dir: str = _f("", "Output folder ('' = runs/<time>-<preset>).")
    checkpoint_every: int = _f(10, "Save a checkpoint every this many iterations (and at the end).")
    keep_checkpoints: int = _f(2, "How many recent checkpoints to keep (folders set aside by --resume --checkpoint, "
                                  "checkpoints/superseded-*, are kept apart from these until you delete them).")
    lock: bool = _f(True, "Lock the run folder (flock on RUN/solrl.lock) so two runs never write it. false: for a "
                          "filesystem without flock (some NFS); then nothing stops two writers.")
    device: str = _f("auto", "cpu, cuda, cuda:N or auto.")
    dtype: str = _f("auto", "Full-precision dtype: auto (bf16 on CUDA, fp32 on CPU), bf16, fp32.")
    threads: int = _f(0, "CPU threads for torch in each process. 0 = auto: one per core this process may use (CPU "
                         "affinity, cgroup quota) divided among this node's processes, at least 1; idle threads sleep "
                         "(OMP_WAIT_POLICY=PASSIVE).")
    lanes: bool = _f(True, "On a CPU: independent batches and micro-steps side by side, one torch thread each "
                           "(docs/speed-and-memory.md). false: every op split over all threads.")
    stop_on_sigterm: str = _f("phase", "What a first SIGTERM stops at: phase (the next phase boundary: an iteration "
                                       "whose update has not begun is abandoned and redone on resume; fits a cluster's "
                                       "grace period) or iteration (finish it, as Ctrl-C does). A second signal stops "
                                       "at once.")
    compile_mode: str = _f("max-autotune-no-cudagraphs", "torch.compile mode of the compiled explore and rollout "
                                      "copies (explore.compile, sampler.compile): max-autotune-no-cudagraphs (the "
                                      "official code's for its inference copies, configs/sol_rl/base.py:112: autotunes "
                                      "each GEMM, a longer compile; kept until a GPU measurement shows it slower than "
                                      "default: none has been made) or default. On CUDA only: a CPU compiles in "
                                      "torch's default mode (Inductor's CPU max-autotune failed on the tiny model, "
                                      "regions.py). The update's compiled blocks (optimizer.compile) use torch's "
                                      "default mode: the official update runs eager, so it has no mode to follow.")
    tf32: bool = _f(True, "TF32 tensor cores for fp32 matmuls and convolutions on CUDA "
                          "(torch.set_float32_matmul_precision 'high', torch.backends.cudnn.allow_tf32), set once when "
                          "the device is resolved, for training and every side tool, as the official base config and "
                          "scripts (configs/sol_rl/base.py:25; train_sana.py:583-585, train_flux1.py:616-618, "
                          "train_sd3.py:641-643). false: full fp32 ('highest', cuDNN without TF32). No effect on a "
                          "CPU.")
    eval_prompts: str = _f("", "Prompt set evaluated with the EMA weights during training, any run.prompts spec ('' = "
                               "none).")
    eval_every: int = _f(20, "Evaluate every this many iterations (and before the first and after the last).")
    eval_seeds: int = _f(4, "Fixed noise seeds per evaluation prompt (the same for every evaluation).")
    eval_rewards: tuple[str, ...] = _f((), "Rewards scored at every evaluation besides the trained one(s), on the same "
                                           "images, never trained on: each shown base -> now with its paired standard "
                                           "error (docs/rewards.md). The real-model presets: imagereward, pickscore, "
                                           "clipscore, hpsv2, as the paper reports; tiny: tinyworld_fidelity. `--set "
                                           "run.eval_rewards=` drops them.")
    on_hacking: str = _f("warn", "What a run does when an evaluation finds reward hacking: the trained reward up since "
                                 "the base while an eval reward fell by more than two paired standard errors and more "
                                 "than its floor (docs/rewards.md). warn: a RewardHacking warning; stop: also stop, "
                                 "with a checkpoint of the iteration just evaluated (--resume goes on past it); "
                                 "rollback: go back to the newest checkpoint whose evaluation no rule flagged, then do "
                                 "what run.rollback_then says.")
    rollback_then: str = _f("stop", "After a rollback: stop (end the run there, its later checkpoints set aside: the "
                                    "newest is the last good one) or lower_lr (train on from it at half the learning "
                                    "rate, halved again at each rollback; the fourth rollback stops). Training on "
                                    "unchanged is not offered: every draw derives from (seed, iteration), so the same "
                                    "fall would follow.")
    hacking_floors: dict[str, float] = _f({}, "Per eval reward, the smallest fall that counts as hacking, in the "
                                              "reward's units, instead of the floor it declares (rewards/registry.py; "
                                              "docs/rewards.md), e.g. --set run.hacking_floors.tinyworld_fidelity=0.1.")
    min_trade: float = _f(0.0, "The early stop on the trade (loop/frontier.py): at each evaluation, the trained-reward "
                               "gain since the previous one per unit of each eval reward lost since then (a fall past "
                               "two paired standard errors); below this the run stops, with a checkpoint of the "
                               "iteration just evaluated, and --best's frontier walk stops where a step bought less. 0 "
                               "= off (--best takes the highest gain). docs/rewards.md.")
    stop_on_hacking: bool = _f(False, "Deprecated: run.on_hacking=stop (true still stops, with a deprecation warning).")
    log: tuple[str, ...] = _f((), "Experiment trackers fed from rank 0: tensorboard, wandb (pip install -e "
                                  "'.[tracking]').")
    image_every: int = _f(10, "Send the trackers a grid of one prompt's Stage-2 samples every this many iterations (0 "
                              "= never).")

    @property
    def hacking_action(self) -> str:
        """run.on_hacking, the deprecated run.stop_on_hacking=true read as stop."""
        return "stop" if self.stop_on_hacking and self.on_hacking == "warn" else self.on_hacking


@dataclass(frozen=True)
class DistributedConfig:
    strategy: str = _f("auto", "How the transformer is held over the processes: replicate (a full copy on every GPU, "
                               "with the explore and rollout copies the plan keeps), fsdp (torch FSDP2: each block's "
                               "weights sharded over the processes of a node and replicated across nodes, gathered "
                               "block by block for each forward; a low-precision explore copy built from the shards, "
                               "whole or sharded as distributed.copy_layout says; a full-precision rollout copy only "
                               "with sampler.rollout_copy=true, sharded), or auto (replicate while the memory ESTIMATE "
                               "of one replica fits the GPU, or with one process; else fsdp). docs/distributed.md.")
    copy_layout: str = _f("auto", "Under distributed.strategy=fsdp, how each process holds the low-precision explore "
                                  "copy: whole (all of it on every GPU), sharded (1/S of it, sharded like the policy "
                                  "and gathered block by block for Stage 1's forwards), or auto (whole where the "
                                  "memory ESTIMATE says it fits, else sharded, else Stage 1 at the run dtype). Ignored "
                                  "by replicate. docs/distributed.md.")


@dataclass(frozen=True)
class MemoryConfig:
    """Memory modes for one tight GPU (memory_modes.py); `auto` takes the first rung of the ladder whose
    memory ESTIMATE fits the GPU (gradient checkpointing, optimizer.checkpointing, is a rung too)."""

    copies: str = _f("auto", "Where the explore and rollout copies live between the phases that run on them: gpu "
                             "(always there), cpu-whole (on the CPU, moved to the GPU whole for Stage 1, Stage 2, the "
                             "update's v_old and each refresh, and back after), cpu-blocks (on the CPU, each "
                             "transformer block moved in for its own forward and out after: one block on the GPU at a "
                             "time, the whole copy crossing for every sampler step), auto (gpu on a CPU or where the "
                             "estimate fits, else cpu-whole, then cpu-blocks). Which move is faster is unmeasured (no "
                             "GPU measurement yet).")
    vae_on_cpu: str = _f("auto", "Keep the VAE on the CPU, moved to the GPU for the decode of each rollout or "
                                 "evaluation call and back after (the real models' text encoders visit the GPU only "
                                 "while they encode, in every mode): auto (when the estimate needs it; off on a CPU), "
                                 "true, false.")


@dataclass(frozen=True)
class Config:
    preset: str = _f("", "The preset this config was built from, as <model>_<family>_<reward>.")
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    run: RunConfig = field(default_factory=RunConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)

    def validate(self) -> "Config":
        """Cross-field rules. Raises SolrlError naming the knob and the fix."""
        n, k = self.explore.group_size, self.selection.group_size
        family = self.algorithm.family
        for key, allowed in choices():
            section, _, name = key.partition(".")
            check_choice(key, getattr(getattr(self, section), name), allowed)
        check_hacking(self.run)
        if self.explore.calibrate != "off" and not (FAMILIES[family].preview_steps and FAMILIES[family].regenerate):
            raise SolrlError(f"explore.calibrate={self.explore.calibrate} chooses preview steps, which family {family} "
                             "does not run (its Stage 1 is at full steps)",
                             "drop explore.calibrate or use --family sol_rl")
        if self.explore.calibrate == "steps+precision" and self.explore.precision in ("bf16", "fp32"):
            raise SolrlError("explore.calibrate=steps+precision chooses among low explore precisions, and "
                             f"explore.precision={self.explore.precision} keeps no low-precision explore copy to "
                             "replace",
                             "use explore.precision=auto (or a low one), or explore.calibrate=steps")
        if k < 2 or k % 2:
            raise SolrlError(f"selection.group_size K={k} must be an even number >= 2",
                             "K/2 best and K/2 worst seeds are kept: use e.g. --set selection.group_size=24")
        if FAMILIES[family].explores_pool and k > n:
            raise SolrlError(f"K={k} kept seeds is more than the N={n} explored",
                             f"raise explore.group_size to at least {k} or lower selection.group_size")
        if self.explore.steps > self.sampler.steps:
            raise SolrlError(f"explore.steps={self.explore.steps} preview steps exceed "
                             f"sampler.steps={self.sampler.steps} full steps",
                             "preview steps must be <= full steps: lower explore.steps")
        check_ranges(self, lambda section, key: getattr(_SECTION_TYPES[section](), key))
        bad = [g for g in self.model.quant_fused if len([m for m in g.split("+") if m]) < 2]
        if bad:
            raise SolrlError(f"model.quant_fused entry '{bad[0]}' is not a group of two or more projections",
                             "write each group as suffixes joined by '+', e.g. attn2.to_k+attn2.to_v")
        for name in self.run.log:
            check_choice("run.log", name, TRACKERS)
        twice = sorted({n for n in self.run.log if self.run.log.count(n) > 1})
        if twice:
            raise SolrlError(f"run.log names {twice[0]} twice", f"name each tracker once, e.g. "
                                                                f"run.log={','.join(dict.fromkeys(self.run.log))}")
        if int(self.sampler.steps * self.algorithm.timestep_fraction) < 1:
            raise SolrlError("no timestep would be trained: sampler.steps * algorithm.timestep_fraction < 1",
                             "raise algorithm.timestep_fraction or sampler.steps")
        check_loss_settings(self)
        if self.sampler.guidance != 1.0:
            raise SolrlError(f"sampler.guidance={self.sampler.guidance}: classifier-free guidance is not supported",
                             "Sol-RL trains and samples without CFG: keep sampler.guidance=1.0")
        if not self.reward.weights:
            raise SolrlError("no reward configured", "pass --reward NAME or --reward NAME=W,NAME=W")
        parse_timeout(self.reward.timeout_s)
        check_names(self.reward.weights, {k: v for k, v in self.reward.paths.items() if k not in self.run.eval_rewards})
        # a typo in an eval reward: named now, not at the first evaluation
        check_names(dict.fromkeys(self.run.eval_rewards, 1.0), {})
        check_settings(self.reward.remote)
        check_model_path(self.model)
        check_frames(self)
        if self.model.max_sequence_length and self.model.loader not in T5_LOADERS:
            raise SolrlError(f"model.max_sequence_length={self.model.max_sequence_length} applies to the T5-encoded "
                             f"models ({', '.join(T5_LOADERS)}), not to loader {self.model.loader}",
                             "drop the setting (this model's encoder length is fixed by its pipeline)")
        return self


_SECTION_TYPES = {f.name: f.default_factory for f in fields(Config) if f.name != "preset"}  # declared once, in Config
